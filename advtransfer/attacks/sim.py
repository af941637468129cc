"""SIM (Lin et al. 2020, the scale-invariance half of SI-NI-FGSM): MI-FGSM whose gradient is the
mean over scale copies x/2^i, i = 0..m−1, of the input gradient (through the scaling, as in the
authors' code). ``nesterov: true`` gives SI-NI-FGSM."""
from __future__ import annotations

from .base import register_attack
from .params import Param
from .iterative import CopyAveragedAttack


@register_attack("sim", kind="gradient", version=1)
class SIM(CopyAveragedAttack):
    """Parameters: ``n_scales`` (m = 5 as in the paper), ``momentum`` (1.0), ``nesterov`` (false).
    At 32×32 the paper's m = 5 (down to x/16) is kept: scaling is by value, not by size, so the
    ImageNet setting carries over unchanged. Cost: T·m per model."""

    parameters = {**CopyAveragedAttack.parameters, "n_scales": Param(5, "int", lo=1, doc="scale copies"),
                  "nesterov": Param(False, "bool", doc="Nesterov look-ahead (SI-NI)")}

    def init_extra(self, **kwargs):
        extra = super().init_extra(**kwargs)
        self.nesterov = bool(extra["nesterov"])
        return extra

    def n_copies(self) -> int:
        return int(self.extra["n_scales"])

    def copy_transforms(self, state: None) -> list:
        return [(lambda x, s=2.0 ** -i: x * s) for i in range(self.n_copies())]
