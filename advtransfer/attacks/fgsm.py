"""FGSM (Goodfellow et al. 2015): one step of size ε along the ascent direction."""
from __future__ import annotations

import torch

from .base import Attack, SurrogateCall, register_attack
from .ops import ascent_direction


@register_attack("fgsm", kind="gradient", version=1)
class FGSM(Attack):
    """x_adv = x + ε·sign(∇L) (L∞) or x + ε·∇L/‖∇L‖₂ (L2). ``steps`` is always 1."""

    default_steps = 1

    def default_alpha(self) -> float:
        return self.eps

    def perturb(self, S: SurrogateCall, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        S.advance()
        g = S.grad(x, y)
        return x + self.eps * ascent_direction(g, self.norm)

    def grad_evals_formula(self, n_models: int) -> int:
        return n_models
