"""CWA, the Common Weakness Attack (Chen et al. 2024), MI variant, L∞ (and L2, below).

Per outer step t (x_o the current iterate, every norm per sample):
  1. g = ∇ of the ensemble loss at x_o (mean logits by default: ``ensemble: logit``);
  2. reverse (SAM-like) step: x ← Π(x_o − r·sign(g)), towards *lower* loss;
  3. cosine-similarity encouragement: for each member i in turn, g_i = ∇L_i(x);
     m ← μ_in·m + g_i/‖g_i‖₂; x ← Π(x + β·m);
  4. G = x − x_o; M ← μ·M + G/‖G‖₁; x ← Π(x_o + α·sign(M)).
Π projects onto the ε-ball around the clean image and onto [0,1]. The inner momentum m carries
over between outer steps, as in the authors' code. Cost: 2n gradient evaluations per step.

Defaults: T = 10, μ = μ_in = 1, r = ε/15 (``r_over_eps``), α = ε/5 (the paper's values).
β (``beta``): the paper uses 50 (its code 250) at 224×224; the inner step adds β·m with m a sum
of unit-L2 gradients, whose per-pixel size is about 1/√(H·W·3), so the same per-pixel move at
32×32 needs β ≈ 50·√3072/√150528 ≈ 7, and β = 50 simply fills the ε-ball. The 32×32 default
β = 2 (``DEFAULT_BETA_32``) comes from a sweep on the cpu zoo, flat between 0.5 and 2; pass
``beta: 50`` for the paper's setting. On the converged zoo ``grids/cwa-beta.yaml`` measures β = 2,
7 and 50 against each other and against MI-FGSM on the logit ensemble (the sweep's and that
grid's numbers: results/notes/settings-measurements.md).

The official code normalises G by the L1 norm of the *whole batch* (coupling images); here
each image is normalised on its own. The ablations live in :mod:`.cwa_sam` and :mod:`.cwa_cse`.

L2 (``norm: l2``, not in the paper, which is L∞ only): every sign step becomes the per-sample
unit-L2 direction (steps 2 and 4: x_o − r·g/‖g‖₂, x_o + α·M/‖M‖₂) and Π projects onto the L2
ball; r = ε/15 and α = ε/5 as in L∞. The inner step β·m is an L2 move already (m a sum of unit-L2
gradients); its default in L2 is β = ε (one ε-sized move per member, where the L∞ default of 2
moves each pixel by about ε at 8/255), and a given ``beta`` is used as it is.
"""
from __future__ import annotations

from typing import Any

import torch

from ..core.utils import parse_fraction
from .base import Attack, SurrogateCall, register_attack, take_extra as _take_extra
from .params import Param
from .ops import ascent_direction, normalize, project

DEFAULT_BETA_32 = 2.0
PAPER = {"beta": 50.0, "r_over_eps": 1 / 15, "alpha_over_eps": 1 / 5, "momentum": 1.0, "inner_momentum": 1.0}


class CWAFamily(Attack):
    """Shared parameters and pieces of CWA and its ablations (L∞, and L2 as described above)."""

    norms = ("linf", "l2")

    def default_alpha(self) -> float:
        return self.eps / 5

    parameters = {"momentum": Param(1.0, "number", lo=0, doc="outer momentum"),
                  "inner_momentum": Param(1.0, "number", lo=0, doc="inner momentum"),
                  "beta": Param(DEFAULT_BETA_32, "number", lo=0, doc="inner step size β"),
                  "r_over_eps": Param("1/15", "number", lo=0, doc="SAM radius r as a fraction of ε")}

    def init_extra(self, **kwargs: Any) -> dict[str, Any]:
        given_beta = "beta" in kwargs
        extra = _take_extra(self, kwargs)
        if self.norm == "l2" and not given_beta:
            extra["beta"] = self.eps  # one ε-sized L2 move per member (see the module docstring)
        extra = {k: parse_fraction(v, k) for k, v in extra.items()}
        return extra

    @property
    def r(self) -> float:
        """Reverse step size in pixel units (r_over_eps·ε)."""
        return self.extra["r_over_eps"] * self.eps

    def reverse(self, S: SurrogateCall, x_o: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Steps 1–2: Π(x_o − r·sign(∇ ensemble loss at x_o)). Costs n."""
        g = S.grad(x_o, y)
        return project(x_o - self.r * ascent_direction(g, self.norm), x, self.eps, self.norm)

    def encourage(self, S: SurrogateCall, x_in: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                  m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 3: one pass over the members with inner momentum. Costs n. Returns (x, m)."""
        beta, mu_in = self.extra["beta"], self.extra["inner_momentum"]
        for i in range(len(S)):
            g = S.grad(x_in, y, idx=[i])
            m = mu_in * m + normalize(g, 2)
            x_in = project(x_in + beta * m, x, self.eps, self.norm)
        return x_in, m

    def outer(self, M: torch.Tensor, G: torch.Tensor, x_o: torch.Tensor,
              x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 4: M ← μ·M + G/‖G‖₁ (per sample); returns (Π(x_o + α·sign(M)), M) (L2: M/‖M‖₂)."""
        M = self.extra["momentum"] * M + normalize(G, 1)
        return project(x_o + self.alpha * ascent_direction(M, self.norm), x, self.eps, self.norm), M


@register_attack("cwa", kind="ensemble", version=1)
class CWA(CWAFamily):
    """MI-CWA: reverse step, cosine-similarity encouragement, outer momentum step (2n per step)."""

    def perturb(self, S: SurrogateCall, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        x_adv, m, M = x.clone(), torch.zeros_like(x), torch.zeros_like(x)
        for _ in range(self.steps):
            S.advance()
            x_o = x_adv
            x_in = self.reverse(S, x_o, x, y)
            x_in, m = self.encourage(S, x_in, x, y, m)
            x_adv, M = self.outer(M, x_in - x_o, x_o, x)
        return x_adv

    def grad_evals_formula(self, n_models: int) -> int:
        return self.steps * 2 * n_models
