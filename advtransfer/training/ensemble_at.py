"""Ensemble adversarial training (Tramèr et al., 2018): adversarial examples come in turn from the
model being trained and from static, pre-trained source models, so that the model learns to
resist perturbations made on other models (the classic defence against transfer attacks)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data import Split
from ..core.errors import UserError
from ..core.utils import parse_fraction
from .base import TrainOutput, register_method
from .context import TrainingContext
from .resume import ResumeHooks
from .standard import fgsm_rs_example, fit


def static_sources(recipe: dict, ctx: TrainingContext) -> dict[str, nn.Module]:
    """The recipe's ``sources`` as loaded, frozen modules (the zoo loads them into
    ``ctx.sources``), in the recipe's order."""
    names = recipe.get("sources")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise UserError(f"{ctx.name}: sources must be a non-empty list of zoo model names")
    missing = [n for n in names if n not in ctx.sources]
    if missing:
        raise UserError(f"{ctx.name}: the source models {missing} were not loaded; train it through "
                        f"the zoo (`advtransfer zoo train`)")
    return {n: ctx.sources[n] for n in names}


@register_method("ensemble_at", version=1)
def train_ensemble_at(net: nn.Module, recipe: dict, data: Split, ctx: TrainingContext) -> TrainOutput:
    """Ensemble adversarial training. Per batch, the source of the adversarial examples rotates
    over [the model itself, *sources]; half the batch (``adv_fraction``, 0.5) is replaced by
    FGSM-with-random-start examples (``at_eps`` 8/255, ``at_alpha`` 1.25ε) of that source, and the
    loss weighs them by λ (``adv_weight``, 0.3): L = (Σ_clean CE + λ Σ_adv CE) / (m − k + λk), the
    loss of Kurakin et al. (2017) that Tramèr et al. train with."""
    sources = static_sources(recipe, ctx)
    eps = parse_fraction(recipe.get("at_eps", "8/255"))
    alpha = parse_fraction(recipe.get("at_alpha", 1.25 * eps))
    frac = float(recipe.get("adv_fraction", 0.5))
    lam = float(recipe.get("adv_weight", 0.3))
    if not 0 < frac <= 1 or lam < 0:
        raise UserError(f"adv_fraction must be in (0, 1] and adv_weight >= 0, got {frac}, {lam}")
    pool: list[nn.Module | None] = [None, *sources.values()]  # None: the model being trained
    gen = torch.Generator().manual_seed(int(recipe.get("seed", 0)) + 11)
    counter = {"step": 0}

    def backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor, ls: float) -> torch.Tensor:
        src = pool[counter["step"] % len(pool)]
        counter["step"] += 1
        k = max(1, int(round(frac * len(x))))
        attacker = model if src is None else src
        x = x.clone()
        x[:k] = fgsm_rs_example(attacker, x[:k], y[:k], eps, alpha, gen)
        losses = F.cross_entropy(model(x), y, reduction="none", label_smoothing=ls)
        loss = (losses[k:].sum() + lam * losses[:k].sum()) / (len(x) - k + lam * k)
        loss.backward()
        return loss

    def get_state() -> dict:
        return {"gen": gen.get_state(), "step": counter["step"]}

    def set_state(state: dict) -> None:
        gen.set_state(state["gen"])
        counter["step"] = int(state["step"])

    # resumable: the source rotation and the FGSM starts, saved with the loop's state
    out = fit(net, recipe, data, ctx, backward=backward, resume_hooks=ResumeHooks(get_state, set_state))
    out.meta.update(at_eps=eps, at_alpha=alpha, adv_fraction=frac, adv_weight=lam)
    out.meta["surrogate_params"] = {"epochs": int(recipe["epochs"]), "at_eps": eps, "sources": list(sources)}
    return out
