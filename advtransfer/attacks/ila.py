"""ILA, the intermediate level attack (Huang et al. 2019): a baseline attack gives x′; then, from
the clean image, ascend the projection of the layer-l feature change onto the guide
F_l(x′) − F_l(x): ⟨F_l(x_adv) − F_l(x), (F_l(x′) − F_l(x))/‖F_l(x′) − F_l(x)‖₂⟩ (per sample)."""
from __future__ import annotations

import torch

from .base import register_attack
from .params import Param
from .features import SPECIAL_LAYERS, FeatureLevelAttack
from .iterative import IterativeAttack


@register_attack("ila", kind="feature", version=1)
class ILA(FeatureLevelAttack, IterativeAttack):
    """Parameters: ``layer`` (``auto``: the middle block), ``base_steps`` (10: the baseline stage,
    MI-FGSM with the same ε and α, or I-FGSM when ``momentum`` is 0), ``steps`` (the ILA stage),
    ``momentum`` (1.0 in both stages; the authors used I-FGSM, momentum 0). The ILA stage starts from
    the clean image, as in the authors' code. Cost: (base_steps + T) per model."""

    default_momentum = 1.0
    parameters = {**IterativeAttack.parameters, "layer": Param("auto", "layer", choices=SPECIAL_LAYERS, doc="the layer: a module name, auto (the middle block) or penultimate"),
                  "base_steps": Param(10, "int", lo=1, doc="steps of the I-FGSM that gives the guide")}

    def init_extra(self, **kwargs):
        extra = super().init_extra(**kwargs)
        self.check_untargeted()
        return extra

    def prepare(self, S, T, x, y, index):
        from . import create_attack

        base = create_attack("mifgsm" if self.extra["momentum"] > 0 else "ifgsm", eps=self.eps, norm=self.norm,
                             steps=int(self.extra["base_steps"]), alpha=self.alpha, momentum=self.extra["momentum"])
        x_base = base.perturb(S, x, y, index)  # the same call: its gradient evaluations count here
        states = []
        with torch.no_grad():
            for t in T:
                f0, _ = t.features(x)
                f1, _ = t.features(x_base)
                guide = (f1 - f0).flatten(1)
                guide = guide / guide.norm(dim=1, keepdim=True).clamp_min(1e-12)
                states.append((f0.flatten(1), guide))
        return states

    def feature_objective(self, i, f, logits, state, y):
        f0, guide = state
        return ((f.flatten(1) - f0) * guide).sum(1)

    def grad_evals_formula(self, n_models: int) -> int:
        return (int(self.extra["base_steps"]) + self.steps) * n_models
