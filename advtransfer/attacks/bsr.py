"""BSR (Wang et al. 2024, block shuffle and rotation): MI-FGSM whose gradient is the mean over N
copies of the image cut into blocks, shuffled, each strip rotated.

``form: authors`` (the default) draws and applies the transform as the BSR authors' PyTorch code
does (TransferAttack ``transferattack/input_transformation/bsr.py``, by the BSR authors' group;
torchattack's ``BSR`` is the same): strip sizes from ``np.random.uniform(2, size=num_block)``
(uniform on (1, 2], so no strip is thinner than 1/(2n−1) of the image), bilinear rotation with
torchvision's zero fill. ``form: v1`` is version 1 of this attack: strip sizes proportional to
U(0,1) draws (as the authors' earlier TensorFlow ``get_length``) and nearest-neighbour rotation.
"""
from __future__ import annotations

import torch

from .base import register_attack
from .params import Param
from .iterative import CopyAveragedAttack
from .transforms import BSR_FORMS, BlockShuffleRotation


@register_attack("bsr", kind="gradient", version=2)
class BSR(CopyAveragedAttack):
    """Parameters: ``n_copies`` (N = 20: TransferAttack's ``num_scale=20``), ``blocks`` (2 per axis,
    the paper's 2×2 and the authors' TensorFlow default; TransferAttack's default is 3),
    ``degrees`` (24: rotations uniform in [−24°, 24°], ``T.RandomRotation(degrees=(-24, 24))``),
    ``form`` (``authors`` or ``v1``, see the module docstring), ``momentum`` (1.0).

    What ``form: authors`` follows in TransferAttack's ``BSR``: ``shuffle`` (``random.shuffle(dims)``:
    the first axis cut is rows or columns with probability 1/2; ``shuffle_single_dim``: the image
    cut into ``blocks`` strips by ``get_length`` and the strips shuffled; each strip rotated by
    ``image_rotation``, then cut along the other axis with its own ``get_length`` draw and the
    pieces shuffled), ``transform`` (N independent copies), ``get_loss`` (cross-entropy over the
    copies: the gradient is their mean). Deviation, forced by batch independence: the authors
    draw one set of choices per copy for the whole batch (one ``get_length``, one shuffle, one
    angle per strip); here every image draws its own from its generator, with the same
    distribution. At 32×32 the paper's 2×2 split gives blocks of about 16 px, the same fraction of
    the image as at 224×224, so the default carries over unchanged. Cost: T·N per model."""

    parameters = {**CopyAveragedAttack.parameters, "n_copies": Param(20, "int", lo=1, doc="copies a step"),
                  "blocks": Param(2, "int", lo=1, doc="strips per axis"),
                  "degrees": Param(24.0, "number", lo=0, hi=180, doc="largest rotation in degrees"),
                  "form": Param("authors", "choice", choices=BSR_FORMS, doc="which BSR")}

    def init_extra(self, **kwargs):
        extra = super().init_extra(**kwargs)
        return extra

    def n_copies(self) -> int:
        return int(self.extra["n_copies"])

    def setup(self, x: torch.Tensor, index: torch.Tensor) -> BlockShuffleRotation:
        return BlockShuffleRotation(self.rngs(index, "bsr"), int(self.extra["blocks"]),
                                    float(self.extra["degrees"]), str(self.extra["form"]))

    def copy_transforms(self, state: BlockShuffleRotation) -> list[BlockShuffleRotation]:
        return [state] * self.n_copies()
