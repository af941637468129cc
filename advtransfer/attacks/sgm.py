"""SGM, the skip gradient method (Wu et al. 2020): MI-FGSM on surrogates whose residual-branch
gradients are scaled by γ in the backward pass (∂z_{i+1}/∂z_i = 1 + γ·∂f_i/∂z_i), so more of the
gradient flows through the skip connections."""
from __future__ import annotations

from ..errors import UserError
from .base import register_attack
from .iterative import IterativeAttack
from .surgery import SkipGradient, applied


@register_attack("sgm", kind="gradient", version=1)
class SGM(IterativeAttack):
    """Parameters: ``gamma`` (γ = 0.5: the paper's setting for DenseNet; it used 0.2 on ResNet-152,
    whose 50 residual blocks decay the gradient far more than ResNet-20's 9), ``momentum`` (1.0).
    Models without residual blocks in a surrogate set are attacked unchanged; a set with none is a
    UserError. The decay follows the paper's equation (a hook on each residual branch's output);
    the authors' public code scales the gradient at every ReLU of a block by √γ instead, which also
    touches the ReLU after the addition. Cost: T per model."""

    hooks_model = True  # backward-path surgery by hooks: always crafted on the eager model

    default_momentum = 1.0
    extra_defaults = {**IterativeAttack.extra_defaults, "gamma": 0.5}

    def init_extra(self, **kwargs):
        extra = super().init_extra(**kwargs)
        g = float(extra["gamma"])
        if not 0 < g <= 1:
            raise UserError(f"attack 'sgm': gamma must be in (0, 1], got {extra['gamma']!r}")
        return extra

    def perturb(self, S, x, y, index):
        with applied(SkipGradient(float(self.extra["gamma"])), S.models):
            return super().perturb(S, x, y, index)
