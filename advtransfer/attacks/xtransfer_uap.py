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
from typing import Any

import torch

from ..errors import UserError
from .base import SurrogateSet, register_attack
from .universal import UniversalAttack


@register_attack("xtransfer_uap", kind="universal", version=1)
class XTransferUAP(UniversalAttack):
    """UCB bandit over the surrogate pool: ``k`` members per update (default 2), exploration ``ucb_c``
    (default 0.1: rewards, loss increases per update, measured 0.07-0.13 nats on the cpu-size CIFAR
    zoo; a larger c makes the choice close to round-robin)."""

    extra_defaults: dict[str, Any] = {**UniversalAttack.extra_defaults, "k": 2, "ucb_c": 0.1}

    def init_extra(self, **kwargs: Any) -> dict[str, Any]:
        extra = super().init_extra(**kwargs)
        if not isinstance(extra["k"], int) or extra["k"] < 1:
            raise UserError(f"attack {self.name!r}: k must be a positive integer, got {extra['k']!r}")
        extra["ucb_c"] = float(extra["ucb_c"])
        return extra

    def start(self, S: SurrogateSet) -> None:
        self.k = min(self.extra["k"], len(S))
        self.names = list(S.names)
        self.counts = [0] * len(S)
        self.reward_sum = [0.0] * len(S)
        self.forward_evals = 0

    def members(self, S: SurrogateSet, step: int) -> list[int]:
        t = step + 1
        def score(i: int) -> float:
            if self.counts[i] == 0:
                return math.inf
            return self.reward_sum[i] / self.counts[i] + self.extra["ucb_c"] * math.sqrt(2 * math.log(t) / self.counts[i])
        ranked = sorted(range(len(S)), key=lambda i: (-score(i), i))
        return sorted(ranked[:self.k])

    @torch.no_grad()
    def after_update(self, S, chosen, before, xb, yb, delta) -> None:
        after = self.member_losses(S, (xb + delta).clamp(0, 1), yb, chosen)
        self.forward_evals += len(xb) * len(chosen)
        sign = -1.0 if self.targeted else 1.0   # targeted: a loss *decrease* is the gain
        for j, i in enumerate(chosen):
            self.counts[i] += 1
            self.reward_sum[i] += sign * float(after[j] - before[j])

    def info(self) -> dict[str, Any]:
        return {"bandit_counts": dict(zip(self.names, self.counts)),
                "bandit_mean_reward": {n: (r / c if c else None) for n, r, c in zip(self.names, self.reward_sum, self.counts)},
                "forward_evals_total": self.forward_evals, "k": self.k}
