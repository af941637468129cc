"""PAS-style backpropagation path search (after Zhang et al.'s PAS): MI-FGSM through a searched
backward path. A path decays, per stage s of the surrogate (its sites split into three contiguous
thirds in forward order), the gradient through residual branches by γ_s (SGM's decay) and the
gradient through the off-centre taps of every 3×3 convolution by δ_s (SkipConv: the kernel
reparameterised as its centre tap, the skip, plus the rest, the residual; the forward value is
unchanged). :func:`search_path` scores candidate paths with a one-step attack on held-out images
of the surrogate's own data against validation models the attacker owns (never the victims).
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..core.errors import UserError
from .base import register_attack
from .params import Param
from .iterative import IterativeAttack
from .surgery import Surgery, applied, residual_branch_ends, scale_grad

N_STAGES = 3


def _thirds(items: list) -> list[list]:
    """``items`` split into three contiguous groups (sizes differ by at most one)."""
    n = len(items)
    cuts = [round(n * k / N_STAGES) for k in range(N_STAGES + 1)]
    return [items[cuts[k]:cuts[k + 1]] for k in range(N_STAGES)]


def skipconv_sites(model: nn.Module) -> list[tuple[str, nn.Conv2d]]:
    """3×3 convolutions (any stride, groups) in registration order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3)]


class PathDecay(Surgery):
    """Per-stage residual-branch decay γ_s and SkipConv decay δ_s (values in (0, 1]; 1 = unchanged)."""

    name = "pas"

    def __init__(self, gammas: Sequence[float], deltas: Sequence[float]) -> None:
        self.gammas, self.deltas = [float(g) for g in gammas], [float(d) for d in deltas]

    def attach(self, model: nn.Module) -> tuple[int, list[Callable[[], None]]]:
        handles = []
        for stage, g in zip(_thirds(residual_branch_ends(model)), self.gammas):
            if g != 1.0:
                handles += [m.register_forward_hook(lambda _m, _i, out, g=g: scale_grad(out, g)) for _, m in stage]
        for stage, d in zip(_thirds(skipconv_sites(model)), self.deltas):
            if d != 1.0:
                handles += [m.register_forward_hook(_skipconv_hook(d)) for _, m in stage]
        return len(handles), [h.remove for h in handles]


def _skipconv_hook(delta: float):
    def hook(m: nn.Conv2d, inputs, out):
        x = inputs[0]
        centre = torch.zeros_like(m.weight)
        centre[:, :, 1, 1] = m.weight[:, :, 1, 1]
        skip = F.conv2d(x, centre, None, m.stride, m.padding, m.dilation, m.groups)
        res = F.conv2d(x, m.weight - centre, None, m.stride, m.padding, m.dilation, m.groups)
        mixed = skip + delta * res
        return out.detach() + (mixed - mixed.detach())  # value: exactly out; gradient: skip + δ·res
    return hook


def _check_path(values: Any, what: str) -> list[float]:
    if not (isinstance(values, (list, tuple)) and len(values) == N_STAGES
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1 for v in values)):
        raise UserError(f"attack 'pas': {what} must be a list of {N_STAGES} numbers in (0, 1], one per stage, "
                        f"got {values!r} (advtransfer pas MODEL searches them)")
    return [float(v) for v in values]


@register_attack("pas", kind="gradient", version=1)
class PAS(IterativeAttack):
    """Parameters: ``gammas`` (residual-branch decay per stage, [0.5, 0.5, 0.5] by default) and
    ``deltas`` (SkipConv decay per stage, [1.0, 1.0, 1.0]): the defaults are SGM's ``form:
    equation`` at γ = 0.5, and γ = δ = 1 is MI-FGSM exactly (no hook is attached);
    ``advtransfer pas MODEL --validators ...`` searches a path and prints it as these parameters.
    ``momentum`` (1.0). Cost: T per model (the search's cost is paid once, outside the cell).

    The path space is the PAS paper's: a stage's γ_s decays every residual branch of the stage,
    the first (downsampling) block included. SGM's default form, the SGM authors' code, leaves
    the first block of each stage undecayed and scales at the ReLUs; it is not a point of this
    space, and PAS keeps the paper's form (``tests/test_fidelity.py`` checks both statements)."""

    hooks_model = True  # backward-path surgery by hooks: always crafted on the eager model

    default_momentum = 1.0
    parameters = {**IterativeAttack.parameters,
                  "gammas": Param([0.5, 0.5, 0.5], "numbers", lo=0, lo_open=True, hi=1, length=N_STAGES, doc="residual-branch decay per stage"),
                  "deltas": Param([1.0, 1.0, 1.0], "numbers", lo=0, lo_open=True, hi=1, length=N_STAGES, doc="SkipConv decay per stage")}

    def init_extra(self, **kwargs):
        extra = super().init_extra(**kwargs)
        extra["gammas"] = _check_path(extra["gammas"], "gammas")
        extra["deltas"] = _check_path(extra["deltas"], "deltas")
        return extra

    def perturb(self, S, x, y, index):
        with applied(PathDecay(self.extra["gammas"], self.extra["deltas"]), S.models, require=False):
            return super().perturb(S, x, y, index)


#: the search space: per-stage values (a 5·5·5 × 3·3·3 grid; the search samples it)
GAMMA_CHOICES = (0.2, 0.4, 0.6, 0.8, 1.0)
DELTA_CHOICES = (0.5, 0.75, 1.0)


def one_step_score(model: nn.Module, validators: Sequence[nn.Module], x: torch.Tensor, y: torch.Tensor,
                   gammas: Sequence[float], deltas: Sequence[float], eps: float, batch: int = 250) -> float:
    """Mean success (fooled among correctly classified) over ``validators`` of one FGSM step of ε
    taken through the path on ``model`` (the one-step approximation of the attack)."""
    from .base import SurrogateSet

    advs = []
    for s in range(0, len(x), batch):
        S = SurrogateSet(model).bind()
        with applied(PathDecay(gammas, deltas), [model], require=False):
            g = S.grad(x[s:s + batch], y[s:s + batch])
        advs.append((x[s:s + batch] + eps * g.sign()).clamp(0, 1))
    xa = torch.cat(advs)
    rates = []
    with torch.no_grad():
        for v in validators:
            ok = v(x).argmax(1) == y
            fooled = (v(xa).argmax(1) != y) & ok
            rates.append(float(fooled.sum()) / max(1, int(ok.sum())))
    return sum(rates) / len(rates)


def search_path(model: nn.Module, validators: Sequence[nn.Module], x: torch.Tensor, y: torch.Tensor,
                eps: float = 8 / 255, budget: int = 40, seed: int = 0,
                log: Callable[[str], None] | None = None, method: str = "random",
                n_startup: int = 10) -> dict[str, Any]:
    """Search the path space (γ_s in :data:`GAMMA_CHOICES`, δ_s in :data:`DELTA_CHOICES`, s = 1..3:
    5³·3³ = 3,375 paths) with ``budget`` scored candidates, each scored by :func:`one_step_score`.

    ``method``: ``random`` (distinct paths drawn uniformly, seeded) or ``bo``, Bayesian
    optimisation as in the PAS paper: a Gaussian-process surrogate of the score with an
    expected-improvement acquisition (optuna's ``GPSampler``, ordinal parameters), after
    ``n_startup`` random paths. A path proposed twice is scored once and the repeat does not count
    against the budget (up to 5·budget proposals). The reference paths (plain gradient, SGM
    γ = 0.5, SkipConv δ = 0.5) are always scored too, outside the budget. Returns {"best": ...,
    "scored": [{label, gammas, deltas, score}, ...] in scoring order, "references": {...},
    "method": ...}."""
    if method not in ("random", "bo"):
        raise UserError(f"path search must be random or bo, not {method!r}")
    # "sgm": SGM's `form: equation` at γ = 0.5 (every branch decayed), the point of this space nearest SGM
    refs = {"plain": ((1.0,) * 3, (1.0,) * 3), "sgm": ((0.5,) * 3, (1.0,) * 3), "skipconv": ((1.0,) * 3, (0.5,) * 3)}
    scored: list[dict[str, Any]] = []
    cache: dict[tuple, float] = {}

    def score(label: str, gm: Sequence[float], dl: Sequence[float]) -> float:
        key = (tuple(gm), tuple(dl))
        if key not in cache:
            cache[key] = one_step_score(model, validators, x, y, gm, dl, eps)
            scored.append({"label": label, "gammas": list(gm), "deltas": list(dl), "score": cache[key]})
            if log:
                log(f"{label:8s} gammas={list(gm)} deltas={list(dl)} one-step ASR={cache[key]:.3f}")
        return cache[key]

    for label, (gm, dl) in refs.items():
        score(label, gm, dl)
    n_refs = len(scored)
    if method == "random":
        space = list(itertools.product(itertools.product(GAMMA_CHOICES, repeat=N_STAGES),
                                       itertools.product(DELTA_CHOICES, repeat=N_STAGES)))
        g = torch.Generator().manual_seed(seed)
        for k, i in enumerate(torch.randperm(len(space), generator=g)[:budget].tolist()):
            score(f"cand{k}", *space[i])
    elif budget > 0:
        try:
            import optuna
        except ImportError:
            raise UserError("the bo path search needs optuna: pip install 'advtransfer[search]' "
                            "(or use --search random)") from None
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.GPSampler(seed=seed, n_startup_trials=min(n_startup, budget))
        study = optuna.create_study(direction="maximize", sampler=sampler)
        g_lo, g_hi, g_step = GAMMA_CHOICES[0], GAMMA_CHOICES[-1], GAMMA_CHOICES[1] - GAMMA_CHOICES[0]
        d_lo, d_hi, d_step = DELTA_CHOICES[0], DELTA_CHOICES[-1], DELTA_CHOICES[1] - DELTA_CHOICES[0]
        proposals = 0
        while len(scored) - n_refs < budget and proposals < 5 * budget:
            trial = study.ask()
            proposals += 1
            gm = tuple(round(trial.suggest_float(f"gamma{s}", g_lo, g_hi, step=g_step), 4) for s in range(N_STAGES))
            dl = tuple(round(trial.suggest_float(f"delta{s}", d_lo, d_hi, step=d_step), 4) for s in range(N_STAGES))
            study.tell(trial, score(f"bo{len(scored) - n_refs}", gm, dl))
    best = max(scored, key=lambda r: r["score"])
    return {"best": best, "scored": scored, "method": method,
            "references": {r["label"]: r for r in scored if r["label"] in refs}}
