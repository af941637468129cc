"""NAA, the neuron attribution-based attack (Zhang et al. 2022): neuron attributions at layer l are
A = (F_l(x_adv) − F_l(x̄)) ⊙ W, with W the integrated gradient of the true class's probability along
the straight path from x (plus Gaussian noise) to the black baseline x̄ = 0, at the N points
(1 − k/N)·(x + ξ) + (k/N)·x̄, k = 0..N−1, as the authors' code; the attack descends
Σ max(A, 0) − γ·Σ max(−A, 0)."""
from __future__ import annotations

import torch

from .base import register_attack
from .params import Param
from .features import SCORES, SPECIAL_LAYERS, FeatureLevelAttack, layer_grads
from .iterative import IterativeAttack


@register_attack("naa", kind="feature", version=2)
class NAA(FeatureLevelAttack, IterativeAttack):
    """Parameters: ``layer`` (``auto``: the middle block), ``n_ens`` (N = 30 integration points,
    the paper's), ``gamma`` (γ = 1.0, the weight of negative attributions: the paper's linear
    transformation), ``noise`` (σ = 0.1 in pixel units: the authors' 0.2 in their [−1, 1] input
    scale; drawn per image and point from (seed, dataset index)), ``score`` (``prob``, as the
    authors; ``logit``), ``momentum`` (1.0). W is normalised per sample (‖W‖₂ = 1).
    Cost: (N + T) per model."""

    default_momentum = 1.0
    parameters = {**IterativeAttack.parameters, "layer": Param("auto", "layer", choices=SPECIAL_LAYERS, doc="the layer: a module name, auto (the middle block) or penultimate"),
                  "n_ens": Param(30, "int", lo=1, doc="integrated-gradient steps N"),
                  "gamma": Param(1.0, "number", lo=0, doc="weight of negative attributions"),
                  "noise": Param(0.1, "number", lo=0, doc="noise scale of the path"),
                  "score": Param("prob", "choice", choices=SCORES, doc="the attributed score")}

    def init_extra(self, **kwargs):
        extra = super().init_extra(**kwargs)
        self.check_untargeted()
        return extra

    def prepare(self, S, T, x, y, index):
        n, sigma = int(self.extra["n_ens"]), float(self.extra["noise"])
        base = torch.zeros_like(x)
        gens = self.rngs(index, "naa")
        W = [None] * len(T)
        for k in range(n):
            xi = torch.stack([torch.randn(x.shape[1:], generator=g) for g in gens]).to(x.device, x.dtype)
            point = (1 - k / n) * (x + sigma * xi) + (k / n) * base
            for i, t in enumerate(T):
                d = layer_grads(t, point, y, self.extra["score"])
                W[i] = d if W[i] is None else W[i] + d
            S.count(len(T))
        states = []
        with torch.no_grad():
            for i, t in enumerate(T):
                fb, _ = t.features(base)
                w = W[i].flatten(1)
                states.append((fb.flatten(1), w / w.norm(dim=1, keepdim=True).clamp_min(1e-12)))
        return states

    def feature_objective(self, i, f, logits, state, y):
        fb, w = state
        a = (f.flatten(1) - fb) * w
        return -(a.clamp_min(0).sum(1) - float(self.extra["gamma"]) * (-a).clamp_min(0).sum(1))

    def grad_evals_formula(self, n_models: int) -> int:
        return (int(self.extra["n_ens"]) + self.steps) * n_models
