"""CWA ablation "CSE": cosine-similarity encouragement and the outer momentum step of CWA,
without the reverse step.

Per outer step from x_o: for each member i, g_i = ∇L_i(x); m ← μ_in·m + g_i/‖g_i‖₂;
x ← Π(x + β·m); then G = x − x_o; M ← μ·M + G/‖G‖₁; x ← Π(x_o + α·sign(M)).
The ensemble gradient of CWA's step 1 only serves the reverse step, so it is not computed:
cost n per step (half of CWA's). Same defaults as :mod:`.cwa`; ``r_over_eps`` is unused.
"""
from __future__ import annotations

import torch

from .base import SurrogateCall, register_attack
from .cwa import CWAFamily


@register_attack("cwa_cse", kind="ensemble", version=1)
class CWACSE(CWAFamily):
    def perturb(self, S: SurrogateCall, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        x_adv, m, M = x.clone(), torch.zeros_like(x), torch.zeros_like(x)
        for _ in range(self.steps):
            S.advance()
            x_in, m = self.encourage(S, x_adv, x, y, m)
            x_adv, M = self.outer(M, x_in - x_adv, x_adv, x)
        return x_adv
