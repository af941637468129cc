"""X-Transfer-style UAP: each δ update uses k surrogates of the pool chosen by a UCB bandit.

The pool is the cell's surrogate set. At update t each member i has a score
mean_reward_i + c·sqrt(2·ln t / n_i) (members never played score +∞, taken in pool order); the k
best are used: loss = mean over the k members of mean_batch(min(L_i, β)). The reward of a chosen
member is its loss increase on the same minibatch, min-clamped loss at the new δ minus at the old
one (one extra forward pass per chosen member, not counted in ``grad_evals``, which counts
forward+backward passes). ``counts`` records how often each member was used: they sum to steps·k.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .base import SurrogateCall, register_attack
from .params import Param
from .universal import UniversalAttack


@register_attack("xtransfer_uap", kind="universal", version=1)
class XTransferUAP(UniversalAttack):
    """UCB bandit over the surrogate pool: ``k`` members per update (default 2), exploration ``ucb_c``
    (default 0.1, on the scale of the rewards, the loss increase per update; a much larger c makes
    the choice close to round-robin; results/notes/settings-measurements.md has the rewards measured)."""

    parameters = {**UniversalAttack.parameters, "k": Param(2, "int", lo=1, doc="surrogates drawn a step"),
                                 "ucb_c": Param(0.1, "number", lo=0, doc="UCB exploration constant")}

    def init_extra(self, **kwargs: Any) -> dict[str, Any]:
        extra = super().init_extra(**kwargs)
        extra["ucb_c"] = float(extra["ucb_c"])
        return extra

    def grad_evals_formula(self, n_models: int) -> int:
        """Gradient evaluations per crafting image: k of the pool's ``n_models`` members an update."""
        return super().grad_evals_formula(min(self.extra["k"], n_models))

    def craft_passes(self, n_models: int, n_images: int) -> int:
        """steps × batch × k (the bandit's reward passes are forward only, not counted)."""
        return super().craft_passes(min(self.extra["k"], n_models), n_images)

    def start(self, S: SurrogateCall) -> Bandit:
        return Bandit(min(self.extra["k"], len(S)), list(S.names), [0] * len(S), [0.0] * len(S))

    def members(self, S: SurrogateCall, step: int, state: Bandit) -> list[int]:
        t = step + 1
        def score(i: int) -> float:
            if state.counts[i] == 0:
                return math.inf
            return (state.reward_sum[i] / state.counts[i]
                    + self.extra["ucb_c"] * math.sqrt(2 * math.log(t) / state.counts[i]))
        ranked = sorted(range(len(S)), key=lambda i: (-score(i), i))
        return sorted(ranked[:state.k])

    @torch.no_grad()
    def after_update(self, S, chosen, before, xb, yb, delta, state: Bandit) -> None:
        after = self.member_losses(S, (xb + delta).clamp(0, 1), yb, chosen)
        state.forward_evals += len(xb) * len(chosen)
        sign = -1.0 if self.targeted else 1.0   # targeted: a loss *decrease* is the gain
        for j, i in enumerate(chosen):
            state.counts[i] += 1
            state.reward_sum[i] += sign * float(after[j] - before[j])

    def info(self, state: Bandit) -> dict[str, Any]:
        return {"bandit_counts": dict(zip(state.names, state.counts)),
                "bandit_mean_reward": {n: (r / c if c else None)
                                       for n, r, c in zip(state.names, state.reward_sum, state.counts)},
                "forward_evals_total": state.forward_evals, "k": state.k}


@dataclass
class Bandit:
    """The UCB bandit of one crafting run: ``k`` members per update, the member ``names``, how
    often each was used (``counts``), the sum of its rewards (loss increases, nats) and the extra
    forward image-passes the rewards cost."""

    k: int
    names: list[str]
    counts: list[int]
    reward_sum: list[float]
    forward_evals: int = 0
