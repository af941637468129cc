"""CWA ablation "SAM": the reverse step of CWA, then an MI step from the original point with the
gradient taken at the reversed point (sharpness-aware minimisation applied to the attack).

Per outer step: x' = Π(x_o − r·sign(∇L(x_o))); g' = ∇L(x'); M ← μ·M + g'/‖g'‖₁ (per sample);
x ← Π(x_o + α·sign(M)). L is the ensemble loss (mean logits by default). Cost 2n per step.
Same defaults as :mod:`.cwa` (r = ε/15, α = ε/5, μ = 1); ``beta``/``inner_momentum`` are
accepted (and recorded) but unused, so a grid can pass CWA's parameters to all three.
"""
from __future__ import annotations

import torch

from .base import SurrogateCall, register_attack
from .cwa import CWAFamily


@register_attack("cwa_sam", kind="ensemble", version=1)
class CWASAM(CWAFamily):
    def perturb(self, S: SurrogateCall, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        x_adv, M = x.clone(), torch.zeros_like(x)
        for _ in range(self.steps):
            S.advance()
            x_rev = self.reverse(S, x_adv, x, y)
            g = S.grad(x_rev, y)
            x_adv, M = self.outer(M, g, x_adv, x)
        return x_adv

    def grad_evals_formula(self, n_models: int) -> int:
        return self.steps * 2 * n_models
