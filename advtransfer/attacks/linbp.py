"""LinBP, linear backpropagation (Guo et al. 2020): MI-FGSM on surrogates whose ReLUs from a chosen
layer on pass the gradient as the identity (the forward pass is unchanged)."""
from __future__ import annotations

from .base import register_attack
from .features import resolve_layer
from .iterative import IterativeAttack
from .surgery import LinearBackward, applied


@register_attack("linbp", kind="gradient", version=1)
class LinBP(IterativeAttack):
    """Parameters: ``layer`` (``auto``: the middle block of the model's block chain, e.g.
    ``net.layers.4`` of a ResNet-20; or a name from ``advtransfer layers MODEL``): every ReLU
    registered at or after it is linearised. ``momentum`` (1.0). Not included: the authors' ResNet
    code also renormalises the residual branch's gradient to the norm it would have had through
    the ReLUs; this is plain linear backpropagation. Cost: T per model."""

    hooks_model = True  # backward-path surgery by hooks: always crafted on the eager model

    default_momentum = 1.0
    extra_defaults = {**IterativeAttack.extra_defaults, "layer": "auto"}

    def perturb(self, S, x, y, index):
        spec = str(self.extra["layer"])
        shape = tuple(x.shape[1:])
        with applied(LinearBackward(lambda m: resolve_layer(m, spec, shape)), S.models):
            return super().perturb(S, x, y, index)
