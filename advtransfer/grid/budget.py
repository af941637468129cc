"""Budgets and matched baselines: how a grid entry becomes the attack of a cell.

``budget: steps`` runs each attack with its parameters; ``budget: grad_evals`` chooses the steps so
the attack spends at most ``grad_evals: N`` gradient evaluations per image. ``alpha_over_eps: k``
sets the step size α = k·ε (pixel space) for every ε of the grid. With ``matched``, every per-image
attack that is not itself the baseline gets MI-FGSM on the logit ensemble matched to it
(:func:`matched_baseline`).
"""
from __future__ import annotations

from typing import Any

from ..core.errors import UserError
from ..core.utils import parse_fraction
from .spec import AttackEntry, GridSpec

#: the baseline every other per-image attack is matched against: MI-FGSM on the logit ensemble
BASELINE_ATTACK = "mifgsm"


def resolve_attack(entry: AttackEntry, spec: GridSpec, eps: float, seed: int, n_models: int) -> Any:
    """The attack object of a cell: ``entry`` at radius ``eps`` (pixel space) with ``seed``, on a
    surrogate set of ``n_models`` models, under the grid's norm, targeting and budget."""
    from ..attacks import ATTACKS, create_attack

    if entry.match != "none":  # a matched baseline: its parameters were resolved for this cell
        return create_attack(entry.attack, eps=eps, seed=seed, **entry.params)
    params = spec.attack_params(entry)  # its sizes.<size> values applied
    params.setdefault("norm", spec.norm)
    if not getattr(ATTACKS.get(entry.attack), "conditional", False):  # multi-target generators are targeted
        params.setdefault("targeted", spec.targeted)
    target_evals = params.pop("grad_evals", None)
    attack = create_attack(entry.attack, eps=eps, seed=seed, **alpha_from_eps(params, eps))
    if spec.budget == "grad_evals":  # GridSpec.validate: every entry gives grad_evals under this budget
        attack = _match_grad_evals(entry, params, eps, seed, n_models, int(target_evals))
    return attack


def alpha_from_eps(params: dict, eps: float) -> dict:
    """``params`` with ``alpha_over_eps: k`` (either budget) turned into the step size α = k·ε."""
    p = dict(params)
    if "alpha_over_eps" in p:
        p["alpha"] = eps * parse_fraction(p.pop("alpha_over_eps"), "alpha_over_eps")
    return p


def _match_grad_evals(entry: AttackEntry, params: dict, eps: float, seed: int, n_models: int, target: int) -> Any:
    """The attack with the most steps whose gradient evaluations per image stay within ``target``."""
    from ..attacks import create_attack

    best = None
    for steps in range(1, 10_000):
        a = create_attack(entry.attack, eps=eps, seed=seed, **alpha_from_eps({**params, "steps": steps}, eps))
        if a.grad_evals_formula(n_models) > target:
            break
        best = a
    if best is None:
        raise UserError(f"attack {entry.label!r} cannot run one step within {target} gradient evaluations")
    return best


def is_baseline(entry: AttackEntry) -> bool:
    """A matched baseline row, or an entry that is itself the baseline (MI-FGSM, logit ensemble)."""
    return entry.match != "none" or (entry.attack == BASELINE_ATTACK and entry.params.get("ensemble", "logit") == "logit")


def _ratio_label(alpha: float, eps: float) -> str:
    k = eps / alpha
    return f"eps/{round(k)}" if abs(k - round(k)) < 1e-6 else f"{alpha * 255:.3g}/255"


def matched_baseline(attack: Any, match: str, n_models: int, momentum: float | None = None) -> tuple[str, dict]:
    """(label, parameters) of the MI-FGSM logit-ensemble baseline matched to a resolved ``attack``
    on ``n_models`` surrogates: ``step`` takes its step size α and its steps; ``evals`` its step
    size α and as many steps as fit in its gradient evaluations per image (MI-FGSM costs one per
    model and step). A targeted attack's baseline aims at the same targets (``target``).
    ``momentum``: the momentum the grid entry set explicitly (e.g. 0 in a regime of I-FGSM
    attacks), which the baseline then takes too; None keeps MI-FGSM's μ = 1. The label names the
    baseline by what defines it, so two attacks with the same matched baseline share one cell."""
    if match == "step":
        steps = attack.steps
    else:
        steps = max(1, attack.grad_evals_formula(n_models) // n_models)
    params = {"steps": steps, "alpha": attack.alpha, "norm": attack.norm, "targeted": attack.targeted,
              "ensemble": "logit"}
    label = f"base_{match}[T={steps},a={_ratio_label(attack.alpha, attack.eps)}"
    if attack.targeted and attack.target != "random":  # random (the default) keeps the ids it always had
        params["target"] = attack.target
    if momentum is not None and float(momentum) != 1.0:
        params["momentum"] = float(momentum)
        label += f",mu={float(momentum):g}"
    return label + "]", params
