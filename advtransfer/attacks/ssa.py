"""SSA (Long et al. 2022, spectrum simulation attack): MI-FGSM whose gradient is the mean over N
spectrum-transformed copies IDCT(DCT(x + ξ) ⊙ M) of the gradient at each copy."""
from __future__ import annotations

import torch

from .base import register_attack
from .params import Param
from .iterative import CopyAveragedAttack
from .transforms import SpectrumSimulation, dct_matrix


@register_attack("ssa", kind="gradient", version=1)
class SSA(CopyAveragedAttack):
    """Parameters: ``n_copies`` (N = 20), ``rho`` (0.5: the mask M ~ U(0.5, 1.5)), ``sigma_over_eps``
    (1.0: noise ξ ~ N(0, ε²), the paper's σ = 16/255 at ε = 16/255), ``momentum`` (1.0). The DCT is
    over the whole image per channel (32×32 here, 299×299 in the paper); the gradient is taken
    at the copy (the authors' code), not through the mask. Randomness is per image. Cost: T·N."""

    parameters = {**CopyAveragedAttack.parameters, "n_copies": Param(20, "int", lo=1, doc="spectrum copies N"),
                  "rho": Param(0.5, "number", lo=0, hi=1, doc="mask M ~ U(1-rho, 1+rho)"),
                  "sigma_over_eps": Param(1.0, "number", lo=0, doc="noise σ as a multiple of ε")}

    def init_extra(self, **kwargs):
        extra = super().init_extra(**kwargs)
        return extra

    def n_copies(self) -> int:
        return int(self.extra["n_copies"])

    def setup(self, x: torch.Tensor, index: torch.Tensor) -> SpectrumSimulation:
        return SpectrumSimulation(self.rngs(index, "ssa"), float(self.extra["sigma_over_eps"]) * self.eps,
                                  float(self.extra["rho"]), dct_matrix(x.shape[-1]))

    def copy_transforms(self, state: SpectrumSimulation) -> list[SpectrumSimulation]:
        return [state] * self.n_copies()  # each call draws fresh noise and mask per image
