"""TI-FGSM (Dong et al. 2019): MI-FGSM whose gradient is smoothed by a Gaussian kernel.

At 32×32 the ImageNet kernel (15×15) wipes the gradient out; the default here is 5×5.
"""
from __future__ import annotations

import torch

from ..core.errors import UserError
from .base import register_attack
from .params import Param
from .iterative import IterativeAttack
from .transforms import InputDiversity, gaussian_kernel, translation_invariant


@register_attack("tifgsm", kind="gradient", version=1)
class TIFGSM(IterativeAttack):
    """Parameters: ``kernel_size`` (odd, default 5), ``nsig`` (3.0), ``momentum`` (1.0),
    ``diversity_prob`` (0.0: no input diversity; > 0 gives TI-DIM) and ``resize_rate`` (0.9)."""

    default_momentum = 1.0
    parameters = {**IterativeAttack.parameters, "kernel_size": Param(5, "int", lo=1, doc="odd Gaussian kernel side"),
                      "nsig": Param(3.0, "number", lo=0, lo_open=True, doc="kernel radius in standard deviations"),
                      "diversity_prob": Param(0.0, "number", lo=0, hi=1, doc="DI probability (0: none)"),
                      "resize_rate": Param(0.9, "number", lo=0, lo_open=True, doc="DI's smallest resize")}

    def init_extra(self, **kwargs):
        extra = super().init_extra(**kwargs)
        k = int(extra["kernel_size"])
        if k % 2 == 0:
            raise UserError(f"attack 'tifgsm': kernel_size must be a positive odd integer, got {k}")
        self._kernel = gaussian_kernel(k, float(extra["nsig"]))
        return extra

    def setup(self, x: torch.Tensor, index: torch.Tensor) -> InputDiversity | None:
        p = float(self.extra["diversity_prob"])
        return InputDiversity(self.rngs(index, "di"), float(self.extra["resize_rate"]), p) if p > 0 else None

    def input_transform(self, state: InputDiversity | None) -> InputDiversity | None:
        return state

    def transform_gradient(self, g: torch.Tensor) -> torch.Tensor:
        return translation_invariant(g, self._kernel)
