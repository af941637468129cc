"""DTA-style layer-wise cosine attack (after Zheng et al. 2023's downstream transfer attack): push
the surrogate's features at several layers away from the clean image's, descending the mean over
layers of cos(F_l(x_adv), F_l(x)). Label-free: it attacks the representation, not a classifier head."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.errors import UserError
from .base import register_attack
from .params import Param
from .features import FeatureLevelAttack, FeatureTap, candidate_layers, check_plain
from .iterative import IterativeAttack


@register_attack("dta", kind="feature", version=1)
class DTA(FeatureLevelAttack, IterativeAttack):
    """Parameters: ``layers`` (``all``: every block of the model's block chain, see
    ``advtransfer layers MODEL``; or a list of layer names), ``momentum`` (1.0). Starts at a uniform random point of the ε-ball (the clean image is a
    stationary point of the objective). Cost: T per model."""

    default_momentum = 1.0
    # the clean image is a stationary point of a label-free feature distance (zero gradient):
    # start uniformly in the ε-ball, drawn per image from (seed, dataset index)
    random_start = True
    parameters = {**IterativeAttack.parameters, "layers": Param("all", "layers", doc="all candidate blocks, or a list of layer names")}

    def init_extra(self, **kwargs):
        extra = super().init_extra(**kwargs)
        v = extra["layers"]
        extra["layers"] = v if v == "all" else list(v)
        self.check_untargeted()
        return extra

    def perturb(self, S, x, y, index):
        """The iterative loop with the call's state: per member, taps at every layer and the clean
        image's features there (flattened, N×D per layer)."""
        taps: list[list[FeatureTap]] = []
        try:
            for m, n in zip(S.models, S.names):
                check_plain(m, n)
                names = candidate_layers(m, tuple(x.shape[1:])) if self.extra["layers"] == "all" else self.extra["layers"]
                if not names:
                    raise UserError(f"attack 'dta': {n} has no block chain for layers 'all'; list layer names")
                taps.append([FeatureTap(m, spec, n, tuple(x.shape[1:])).__enter__() for spec in names])
            with torch.no_grad():
                clean = [[self._feat(t, x).flatten(1) for t in ts] for ts in taps]
            return self.iterate(S, x, y, index, (taps, clean))
        finally:
            for ts in taps:
                for t in ts:
                    t.__exit__(None, None, None)

    @staticmethod
    def _feat(t: FeatureTap, x: torch.Tensor) -> torch.Tensor:
        return t.features(x)[0]

    def gradient(self, S, x_adv, y, state):
        taps, clean = state
        xg = x_adv.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            total = 0
            for i, ts in enumerate(taps):
                S.models[i](xg)  # one forward pass fills every tap of this model
                cos = [F.cosine_similarity(t.out.flatten(1), c, dim=1) for t, c in zip(ts, clean[i])]
                for t in ts:
                    t.out = None
                total = total - S.weights[i].to(xg.dtype) * torch.stack(cos).mean(0).sum()
            (g,) = torch.autograd.grad(total, xg)
        S.count(len(S))
        return g.detach()
