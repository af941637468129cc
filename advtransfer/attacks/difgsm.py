"""DI-FGSM with momentum (M-DI²-FGSM, Xie et al. 2019): gradients through random resize+pad."""
from __future__ import annotations

import torch

from .base import register_attack
from .params import Param
from .iterative import IterativeAttack
from .transforms import InputDiversity


@register_attack("difgsm", kind="gradient", version=1)
class DIFGSM(IterativeAttack):
    """Parameters: ``resize_rate`` (0.9: resize to 28..31 px and pad back to 32), ``diversity_prob``
    (0.5), ``momentum`` (1.0; 0 gives plain DI²-FGSM). Randomness is per image."""

    default_momentum = 1.0
    parameters = {**IterativeAttack.parameters, "resize_rate": Param(0.9, "number", lo=0, lo_open=True, doc="smallest resize as a fraction of the side"),
                      "diversity_prob": Param(0.5, "number", lo=0, hi=1, doc="probability of transforming a copy")}

    def setup(self, x: torch.Tensor, index: torch.Tensor) -> InputDiversity:
        return InputDiversity(self.rngs(index, "di"), float(self.extra["resize_rate"]),
                              float(self.extra["diversity_prob"]))

    def input_transform(self, state: InputDiversity) -> InputDiversity:
        return state
