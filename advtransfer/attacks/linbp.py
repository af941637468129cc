"""LinBP, linear backpropagation (Guo et al. 2020): MI-FGSM on surrogates whose ReLUs from a chosen
layer on pass the gradient as the identity (the forward pass is unchanged).

``form: authors`` (the default) computes what the authors' code computes (qizhangli/linbp-attack
``attack/imagenet/utils.py``, the same in TransferAttack ``transferattack/model_related/linbp.py``):
in each residual block from the layer on, the branch's ReLUs are linear and the branch's input
gradient is renormalised to the norm of the true one; the ReLU after the addition keeps its
derivative (:class:`~advtransfer.attacks.surgery.LinearBackwardRenorm`). ``form: equation`` is
version 1 of this attack: every ReLU registered from the layer on is linear, without
renormalisation (:class:`~advtransfer.attacks.surgery.LinearBackward`).
"""
from __future__ import annotations

from .base import register_attack
from .params import Param
from .features import SPECIAL_LAYERS, resolve_layer
from .backward import BackwardPathAttack
from .surgery import LinearBackward, LinearBackwardRenorm

#: backward-path forms: the authors' code, or plain linear backpropagation (version 1)
FORMS = ("authors", "equation")


@register_attack("linbp", kind="gradient", version=2)
class LinBP(BackwardPathAttack):
    """Parameters: ``layer`` (``auto``: the middle block of the model's block chain, e.g.
    ``net.layers.4`` of a ResNet-20, as the authors' ``linbp_layer='3_1'`` starts ResNet-50 at
    block 9 of its 16; or a name from ``advtransfer layers MODEL``), ``form``
    (``authors``, the default: in every residual block at or after ``layer`` (and the block that
    contains it) the branch's ReLUs are linear in the backward pass (``linbp_relu``), the ReLU
    after the addition keeps its derivative, and the gradient the branch passes back is rescaled
    per sample to the L2 norm it has through the true ReLUs (``alpha = normal_grad_0.norm /
    main_grad.norm``, ``sgm_lambda = 1``); ReLUs from ``layer`` on outside residual blocks (a
    VGG, a MobileNet's head) are linear without rescaling, as the authors' VGG-19 code does;
    ``equation``: version 1, every ReLU registered at or after ``layer`` linear, no
    renormalisation), ``momentum`` (1.0: TransferAttack's MI-FGSM; the authors' own script runs
    300 I-FGSM steps of 1/255 with a random start per step). Cost: T per model."""

    parameters = {**BackwardPathAttack.parameters, "layer": Param("auto", "layer", choices=SPECIAL_LAYERS, doc="the layer: a module name, auto (the middle block) or penultimate"),
                  "form": Param("authors", "choice", choices=FORMS, doc="renormalised (authors) or plain linear backward")}

    def surgery(self, shape: tuple[int, ...]):
        """The backward-path change this attack applies (by ``form``) for inputs of ``shape`` (C×H×W)."""
        spec = str(self.extra["layer"])
        start = lambda m: resolve_layer(m, spec, shape)
        return LinearBackwardRenorm(start) if self.extra["form"] == "authors" else LinearBackward(start)

