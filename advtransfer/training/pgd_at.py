"""PGD adversarial training (Madry et al., 2018): each batch is replaced by L∞ PGD examples
crafted on the model being trained."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data import Split
from ..core.errors import UserError
from ..core.utils import parse_fraction
from .base import TrainOutput, register_method
from .context import TrainingContext
from .resume import STATELESS
from .standard import fit


def at_params(recipe: dict, default_steps: int) -> tuple[float, float, int]:
    """(ε, step size α, steps) of a recipe's training attack, pixels in [0,1]: ``at_eps`` (default
    8/255), ``at_steps`` (default ``default_steps``), ``at_alpha`` (default 2.5ε/steps, Madry et al.)."""
    eps = parse_fraction(recipe.get("at_eps", "8/255"))
    steps = recipe.get("at_steps", default_steps)
    if not isinstance(steps, int) or steps < 1:
        raise UserError(f"at_steps must be a positive integer, got {steps!r}")
    alpha = parse_fraction(recipe.get("at_alpha", 2.5 * eps / steps))
    return eps, alpha, steps


def pgd_example(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, alpha: float, steps: int,
                gen: torch.Generator, loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
                start: str = "uniform") -> torch.Tensor:
    """L∞ PGD maximising ``loss_fn(logits)`` (default: cross-entropy with ``y``, summed) from a
    random start (``uniform`` in the ε-ball, or ``gauss``: 0.001·N(0,1) as TRADES starts); pixels
    in [0,1], ε like 8/255. Runs ``model`` in eval mode (BatchNorm statistics untouched) and
    restores its mode; returns detached examples."""
    was = model.training
    model.eval()
    if loss_fn is None:
        def loss_fn(logits: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(logits, y, reduction="sum")
    if start == "gauss":
        delta = 0.001 * torch.randn(x.shape, generator=gen).to(x.device)
    else:
        delta = (torch.rand(x.shape, generator=gen) * 2 - 1).to(x.device) * eps
    adv = (x + delta).clamp(0, 1)
    try:
        for _ in range(steps):
            adv.requires_grad_(True)
            (g,) = torch.autograd.grad(loss_fn(model(adv)), adv)
            adv = torch.min(torch.max(adv.detach() + alpha * g.sign(), x - eps), x + eps).clamp(0, 1)
    finally:
        model.train(was)
    return adv.detach()


@register_method("pgd_at", version=1)
def train_pgd_at(net: nn.Module, recipe: dict, data: Split, ctx: TrainingContext) -> TrainOutput:
    """PGD adversarial training: ``at_eps`` (8/255), ``at_steps`` (Madry et al.: 7 on CIFAR-10),
    ``at_alpha`` (2.5ε/steps); every training batch is replaced by its PGD examples."""
    eps, alpha, steps = at_params(recipe, 7)

    def make_batch(x: torch.Tensor, y: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        return pgd_example(net, x, y, eps, alpha, steps, gen)

    out = fit(net, recipe, data, ctx, make_batch=make_batch, resume_hooks=STATELESS)
    out.meta.update(at_eps=eps, at_alpha=alpha, at_steps=steps)
    out.meta["surrogate_params"] = {"epochs": int(recipe["epochs"]), "at_eps": eps, "at_steps": steps}
    return out
