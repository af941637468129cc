"""BSR (Wang et al. 2024, block shuffle and rotation): MI-FGSM whose gradient is the mean over N
copies of the image cut into blocks, shuffled, each strip rotated."""
from __future__ import annotations

import torch

from ..errors import UserError
from .base import register_attack
from .iterative import CopyAveragedAttack
from .transforms import BlockShuffleRotation


@register_attack("bsr", kind="gradient", version=1)
class BSR(CopyAveragedAttack):
    """Parameters: ``n_copies`` (N = 20), ``blocks`` (2 per axis, the paper's 2×2), ``degrees``
    (24: rotations in [−24°, 24°]), ``momentum`` (1.0). At 32×32 the paper's 2×2 split gives
    blocks of about 16 px, the same fraction of the image as at 224×224, so the default carries
    over unchanged. Randomness is per image. Cost: T·N per model."""

    extra_defaults = {**CopyAveragedAttack.extra_defaults, "n_copies": 20, "blocks": 2, "degrees": 24.0}

    def init_extra(self, **kwargs):
        extra = super().init_extra(**kwargs)
        if int(extra["n_copies"]) < 1 or int(extra["blocks"]) < 1:
            raise UserError(f"n_copies and blocks must be >= 1, got {extra['n_copies']}, {extra['blocks']}")
        return extra

    def n_copies(self) -> int:
        return int(self.extra["n_copies"])

    def setup(self, x: torch.Tensor, index: torch.Tensor) -> None:
        self._bsr = BlockShuffleRotation(self.rngs(index, "bsr"), int(self.extra["blocks"]),
                                         float(self.extra["degrees"]))

    def copy_transforms(self):
        return [self._bsr] * self.n_copies()
