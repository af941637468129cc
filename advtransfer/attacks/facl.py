"""FACL-Attack (Yang et al., AAAI 2024): the BIA generator (mid-layer feature loss) trained with two
training-time modules in the frequency domain; inference is the plain generator.

**FADR** (frequency-aware domain randomisation) randomises the training image's domain-variant
bands before the generator and the surrogate see it: with c = DCT(x) (orthonormal 2-D DCT per
channel) and the band of coefficient (u, v) given by r = (u + v)/(2(n − 1)) ∈ [0, 1] (low:
r < ``band_low``, high: r ≥ ``band_high``, mid between), x ↦ IDCT(c ⊙ M + ξ ⊙ B) clipped to [0,1],
where M = 1 on the mid band and U(1 − ρ, 1 + ρ) elsewhere, ξ ~ N(0, σ²) and B the low+high mask.
As in the authors' frequency-augmentation precursor (a fork of BIA's code), it is applied on every
other update (odd updates) with σ = 16/255 and ρ = 0.5.

**FACL** (frequency-augmented contrastive learning) splits x and x_adv into their mid band
(domain-agnostic) and the rest (low+high, domain-specific) and reads the surrogate's layer
features of each: z_m, z'_m, z_lh, z'_lh. It pushes z'_m away from z_m and pulls z'_lh toward z_lh:
L_FACL = cos(z'_m, z_m) − cos(z'_lh, z_lh) (per image, flattened features, batch mean), added to
BIA's loss with weight λ (``facl_weight``).

What is simplified (the paper's code is not public; its project page gives the structure, not the
numbers): the band cut-offs (defaults 0.1 and 0.5 of the DCT radius at 32×32), the loss as the
difference of cosine similarities (no temperature), and λ = 1 are this harness's choices, all
parameters. Each update costs 3 surrogate forward+backward passes per image (x_adv, its mid band
and its low+high part).
"""
from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from ..core.errors import UserError
from .base import register_attack
from .params import Param
from .generative import GenerativeAttack, TrainState
from .transforms import dct_2d, dct_matrix, idct_2d


def band_masks(n: int, low: float, high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(mid-band mask, low+high mask), n×n float64, of the 2-D DCT coefficients of an n×n image."""
    u = torch.arange(n, dtype=torch.float64)
    r = (u[:, None] + u[None, :]) / (2 * (n - 1))
    mid = ((r >= low) & (r < high)).double()
    return mid, 1 - mid


@functools.lru_cache(maxsize=4)
def _band_tables(n: int, low: float, high: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(orthonormal DCT matrix, mid-band mask, low+high mask), n×n float64, for n×n images."""
    return (dct_matrix(n), *band_masks(n, low, high))


@register_attack("facl", kind="generative", version=2)
class FACL(GenerativeAttack):
    """BIA + FADR + FACL. Parameters besides the generator's: ``band_low``/``band_high`` (DCT
    radius fractions), ``fadr_sigma`` (noise std, pixels), ``fadr_rho`` (mask spread),
    ``facl_weight`` (λ); ``fadr: false`` or ``facl_weight: 0`` ablate a module."""

    default_objective = "feature"
    parameters = {**GenerativeAttack.parameters, "band_low": Param(0.1, "number", lo=0, hi=1, doc="low edge of the frequency band"),
                                 "band_high": Param(0.5, "number", lo=0, hi=1, doc="high edge of the frequency band"),
                                 "fadr": Param(True, "bool", doc="frequency-aware domain randomisation"),
                                 "fadr_sigma": Param("16/255", "number", lo=0, doc="its noise σ in pixel space"),
                                 "fadr_rho": Param(0.5, "number", lo=0, hi=1, hi_open=True, doc="its spectrum mask ρ"),
                                 "facl_weight": Param(1.0, "number", lo=0, doc="weight of the contrastive term")}

    def init_extra(self, **kwargs: Any) -> dict[str, Any]:
        if self.targeted:
            raise UserError(f"attack {self.name!r} is untargeted (a feature-distance loss); drop targeted: true")
        extra = super().init_extra(**kwargs)
        if extra["objective"] != "feature":
            raise UserError(f"attack {self.name!r}: FACL's contrastive term lives at a surrogate layer; objective must be feature")
        lo, hi = float(extra["band_low"]), float(extra["band_high"])
        if not lo < hi:
            raise UserError(f"attack {self.name!r}: band_low must lie below band_high, got {lo} and {hi}")
        from ..core.utils import parse_fraction

        self._sigma = parse_fraction(extra["fadr_sigma"], "fadr_sigma")
        return extra

    def passes_per_update(self) -> int:
        return 3 if float(self.extra["facl_weight"]) > 0 else 1

    def _bands(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(DCT matrix, mid-band mask, low+high mask) for x's size, in x's dtype and device."""
        d, mid, lh = _band_tables(x.shape[-1], float(self.extra["band_low"]), float(self.extra["band_high"]))
        return d.to(x), mid.to(x), lh.to(x)

    def train_input(self, st: TrainState, x: torch.Tensor) -> torch.Tensor:
        if not self.extra["fadr"] or st.step % 2 == 0:  # FADR on every other update (odd ones, 0-based)
            return x
        g = st.gen
        d, _, lh = self._bands(x)
        rho = float(self.extra["fadr_rho"])
        m = 1 + lh * (torch.rand(x.shape, generator=g, dtype=torch.float64).to(x) * 2 * rho - rho)
        xi = torch.randn(x.shape, generator=g, dtype=torch.float64).to(x) * self._sigma * lh
        return idct_2d(dct_2d(x, d) * m + xi, d).clamp(0, 1)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mid band of x, its low+high rest): x = mid + rest."""
        d, mid, _ = self._bands(x)
        xm = idct_2d(dct_2d(x, d) * mid, d)
        return xm, x - xm

    def train_loss(self, st, x, x_adv, y, t):
        loss = self.base_loss(st, x, x_adv, y, t)
        lam = float(self.extra["facl_weight"])
        if lam == 0:
            return loss
        xm, xlh = self.split(x)
        am, alh = self.split(x_adv)
        w = st.S.weights.to(x_adv.dtype)
        for i, tap in enumerate(st.taps):
            with torch.no_grad():
                zm, _ = tap.features(xm)
                zlh, _ = tap.features(xlh)
            azm, _ = tap.features(am)
            azlh, _ = tap.features(alh)
            push = F.cosine_similarity(azm.flatten(1), zm.flatten(1), dim=1).mean()
            pull = F.cosine_similarity(azlh.flatten(1), zlh.flatten(1), dim=1).mean()
            loss = loss + lam * w[i] * (push - pull)
            st.count(2 * len(x), st.S, i)
        return loss
