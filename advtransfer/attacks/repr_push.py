"""Representation-space attack: push the surrogate's representation at one layer away from the
clean image's, ascending ‖F_l(x_adv) − F_l(x)‖₂ / ‖F_l(x)‖₂ without using labels (the kind of
attack the data-space vs representation-space paper contrasts with label-loss attacks)."""
from __future__ import annotations

import torch

from .base import register_attack
from .params import Param
from .features import SPECIAL_LAYERS, FeatureLevelAttack
from .iterative import IterativeAttack


@register_attack("repr_push", kind="feature", version=1)
class ReprPush(FeatureLevelAttack, IterativeAttack):
    """Parameters: ``layer`` (``penultimate``: the input of the last linear layer, the representation
    the classifier reads; ``auto`` or a layer name for an intermediate one), ``momentum`` (1.0). Starts at a uniform random point of the ε-ball
    (the clean image is a stationary point of the objective). Cost: T per model."""

    default_momentum = 1.0
    # the clean image is a stationary point of a label-free feature distance (zero gradient):
    # start uniformly in the ε-ball, drawn per image from (seed, dataset index)
    random_start = True
    parameters = {**IterativeAttack.parameters, "layer": Param("penultimate", "layer", choices=SPECIAL_LAYERS, doc="the representation pushed")}

    def init_extra(self, **kwargs):
        extra = super().init_extra(**kwargs)
        self.check_untargeted()
        return extra

    def prepare(self, S, T, x, y, index):
        with torch.no_grad():
            out = []
            for t in T:
                f0 = t.features(x)[0].flatten(1)
                out.append((f0, f0.norm(dim=1).clamp_min(1e-12)))
            return out

    def feature_objective(self, i, f, logits, state, y):
        f0, n0 = state
        return (f.flatten(1) - f0).norm(dim=1) / n0
