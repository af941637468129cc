"""Sharpness-aware minimisation (Foret et al. 2021) as a surrogate-training method.

Each step: e = ρ·∇L(w)/‖∇L(w)‖₂ (one norm over all parameters of the model), then the SGD step
uses the gradient at w + e. Large ρ (0.1 and above) is the "large-ρ SAM" that the transferability
papers find to make better surrogates. Costs two forward+backward passes per step.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data import Split
from ..core.errors import UserError
from .base import TrainOutput, register_method
from .context import TrainingContext
from .resume import STATELESS
from .standard import fit


def sam_backward(rho: float, reduction: str = "mean"):
    """A ``backward(net, x, y, label_smoothing)`` for :func:`~.standard.fit` that leaves SAM's
    gradient (taken at w + ρ·g/‖g‖₂) in ``.grad`` with the weights restored; returns the loss at w.
    BatchNorm running statistics are updated by the first pass only. ``reduction`` is the loss's
    over the batch (``mean``; ``sum`` for the fast method's units): the step e does not depend on
    it (g/‖g‖₂ is scale-free), the gradient left in ``.grad`` is that loss's."""

    def backward(net: nn.Module, x: torch.Tensor, y: torch.Tensor, ls: float) -> torch.Tensor:
        params = [p for p in net.parameters() if p.requires_grad]
        loss = F.cross_entropy(net(x), y, label_smoothing=ls, reduction=reduction)
        grads = torch.autograd.grad(loss, params)
        norm = torch.norm(torch.stack([g.norm() for g in grads]))
        scale = rho / (norm + 1e-12)
        es = [g * scale for g in grads]
        bns = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        moms = [m.momentum for m in bns]
        saved = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p, e in zip(params, es):
                p.add_(e)
        for m in bns:
            m.momentum = 0.0  # the perturbed pass must not move the running statistics
        try:
            F.cross_entropy(net(x), y, label_smoothing=ls, reduction=reduction).backward()
        finally:
            for m, mom in zip(bns, moms):
                m.momentum = mom
            with torch.no_grad():
                for p, w in zip(params, saved):
                    p.copy_(w)  # exact restore (adding and subtracting e would round)
        return loss.detach()

    return backward


@register_method("sam", version=1)
def train_sam(net: nn.Module, recipe: dict, data: Split, ctx: TrainingContext) -> TrainOutput:
    """SAM with radius ``rho`` (recipe key; 0.05 usual, ≥ 0.1 "large"), otherwise the recipe's
    SGD loop; ``keep_epochs`` works as for ``standard``."""
    if "rho" not in recipe:
        raise UserError(f"SAM recipe of {ctx.name!r} needs rho (e.g. 0.05, or 0.5 for large-rho SAM)")
    rho = float(recipe["rho"])
    if rho < 0:
        raise UserError(f"SAM rho must be non-negative, got {rho}")
    out = fit(net, recipe, data, ctx, backward=sam_backward(rho), resume_hooks=STATELESS)
    out.meta["surrogate_params"] = {"rho": rho, "epochs": int(recipe["epochs"])}
    return out
