"""FIA, the feature importance-aware attack (Wang et al. 2021): the aggregate gradient
Δ = Σ_n ∂ logit_y(x ⊙ M_n)/∂F_l over N random pixel-drop masks M_n, normalised per sample
(‖Δ‖₂ = 1), weighs the layer's features; the attack descends Σ Δ ⊙ F_l(x_adv)."""
from __future__ import annotations

import torch

from .base import register_attack
from .params import Param
from .features import SCORES, SPECIAL_LAYERS, FeatureLevelAttack, layer_grads
from .iterative import IterativeAttack


@register_attack("fia", kind="feature", version=1)
class FIA(FeatureLevelAttack, IterativeAttack):
    """Parameters: ``layer`` (``auto``: the middle block), ``n_ens`` (N = 30 masks, the paper's),
    ``drop_prob`` (0.3: each pixel and channel dropped with this probability, the paper's value for
    normally trained models), ``score`` (``logit``: the true class's logit, as the authors' code;
    ``prob``: its softmax probability, as torchattack's port), ``momentum`` (1.0). Masks are drawn
    per image from (seed, dataset index). Cost: (N + T) per model."""

    default_momentum = 1.0
    parameters = {**IterativeAttack.parameters, "layer": Param("auto", "layer", choices=SPECIAL_LAYERS, doc="the layer: a module name, auto (the middle block) or penultimate"),
                  "n_ens": Param(30, "int", lo=1, doc="random masks N"),
                  "drop_prob": Param(0.3, "number", lo=0, hi=1, hi_open=True, doc="pixel drop probability"),
                  "score": Param("logit", "choice", choices=SCORES, doc="the score whose gradient weighs the features")}

    def init_extra(self, **kwargs):
        extra = super().init_extra(**kwargs)
        self.check_untargeted()
        return extra

    def prepare(self, S, T, x, y, index):
        gens = self.rngs(index, "fia")
        p = float(self.extra["drop_prob"])
        agg = [None] * len(T)
        for _ in range(int(self.extra["n_ens"])):
            masks = torch.stack([(torch.rand(x.shape[1:], generator=g) >= p) for g in gens]).to(x.device, x.dtype)
            for i, t in enumerate(T):
                d = layer_grads(t, x * masks, y, self.extra["score"])
                agg[i] = d if agg[i] is None else agg[i] + d
            S.count(len(T))
        return [a.flatten(1) / a.flatten(1).norm(dim=1, keepdim=True).clamp_min(1e-12) for a in agg]

    def feature_objective(self, i, f, logits, state, y):
        return -(f.flatten(1) * state).sum(1)

    def grad_evals_formula(self, n_models: int) -> int:
        return (int(self.extra["n_ens"]) + self.steps) * n_models
