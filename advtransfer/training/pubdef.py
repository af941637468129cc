"""PubDef (Sitawarin et al., 2023): training against transfer attacks from a declared pool of
"public" source models. What the authors' code trains (``--data-load-mode mix``, loss ``ce``):
each training image appears clean and as a transfer adversarial example made by one source
chosen uniformly at random, and the loss is w₀·CE(clean) + w₁·CE(transfer example) with
weights normalised to sum to 1 (the example scripts use 1:1).

Simplifications, stated: the authors attack the training set offline (PGD, ε = 8/255, 10 steps,
3 restarts, several stored copies, 8-bit PNG) and may mix several attack algorithms; here the
examples are crafted online, per batch, with L∞ PGD on the chosen source (one restart), then
quantised to 8 bits like the stored PNGs. Since the sources are frozen, crafting online draws
from the same distribution as sampling stored copies, at the same cost per epoch as storing one
fresh copy per epoch. The loss-weighted source mixing of the authors' ``weighted-exp`` option is
not implemented (their example scripts weight uniformly).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data import Split
from ..core.errors import UserError
from ..core.utils import parse_fraction
from .base import TrainOutput, register_method
from .context import TrainingContext
from .ensemble_at import static_sources
from .pgd_at import pgd_example
from .resume import ResumeHooks
from .standard import fit


@register_method("pubdef", version=1)
def train_pubdef(net: nn.Module, recipe: dict, data: Split, ctx: TrainingContext) -> TrainOutput:
    """PubDef against ``sources`` (zoo names): ``at_eps`` (8/255), ``at_steps`` (10),
    ``at_alpha`` (authors: max(0.001, ε/4/(steps/10))), ``clean_weight`` and ``adv_weight`` (1, 1)."""
    sources = list(static_sources(recipe, ctx).values())
    eps = parse_fraction(recipe.get("at_eps", "8/255"))
    steps = recipe.get("at_steps", 10)
    if not isinstance(steps, int) or steps < 1:
        raise UserError(f"at_steps must be a positive integer, got {steps!r}")
    alpha = parse_fraction(recipe.get("at_alpha", max(0.001, eps / 4 / (steps / 10))))
    w0, w1 = float(recipe.get("clean_weight", 1.0)), float(recipe.get("adv_weight", 1.0))
    if w0 < 0 or w1 <= 0:
        raise UserError(f"clean_weight must be >= 0 and adv_weight > 0, got {w0}, {w1}")
    w0, w1 = w0 / (w0 + w1), w1 / (w0 + w1)
    gen = torch.Generator().manual_seed(int(recipe.get("seed", 0)) + 13)
    counts = [0] * len(sources)

    def backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor, ls: float) -> torch.Tensor:
        pick = torch.randint(0, len(sources), (len(x),), generator=gen)
        x_adv = x.clone()
        for s, src in enumerate(sources):
            sel = (pick == s).nonzero().squeeze(1).to(x.device)
            if len(sel):
                x_adv[sel] = pgd_example(src, x[sel], y[sel], eps, alpha, steps, gen)
                counts[s] += len(sel)
        x_adv = (x_adv * 255).round() / 255  # stored as 8-bit images by the authors
        loss = (w0 * F.cross_entropy(model(x), y, label_smoothing=ls)
                + w1 * F.cross_entropy(model(x_adv), y, label_smoothing=ls))
        loss.backward()
        return loss

    def get_state() -> dict:
        return {"gen": gen.get_state(), "counts": list(counts)}

    def set_state(state: dict) -> None:
        gen.set_state(state["gen"])
        counts[:] = [int(c) for c in state["counts"]]

    # resumable: the source picks and PGD starts come from ``gen``, saved with the loop's state
    out = fit(net, recipe, data, ctx, backward=backward, resume_hooks=ResumeHooks(get_state, set_state))
    names = list(static_sources(recipe, ctx))
    out.meta.update(at_eps=eps, at_alpha=alpha, at_steps=steps, clean_weight=w0, adv_weight=w1,
                    source_counts=dict(zip(names, counts)))
    out.meta["surrogate_params"] = {"epochs": int(recipe["epochs"]), "at_eps": eps, "sources": names}
    return out
