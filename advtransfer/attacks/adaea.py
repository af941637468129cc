"""AdaEA, adaptive ensemble attack (Chen et al. 2023), MI variant, L∞/L2.

Per step at x_t (everything per sample):
  g_j = ∇L_j(x_t) for each member j (n gradient evaluations);
  AGM (adaptive weights): x_j = Π(x_t + α·dir(g_j)) fools model j in one step; how well it
  transfers is r_j = Σ_{i≠j} L_i(x_j) / L_i(x_i) (model i's loss on x_j relative to its loss on
  its own one-step example, as the authors' code computes it); w = softmax_j(β·r_j), β = 10.
  ``ratio: mean_own`` gives this harness's version 1 instead, r_j = mean_{i≠j} L_i(x_j) / L_j(x_j)
  (normalised by the source model's own loss; a mean, so β acts n−1 times weaker). Losses are per
  image (the authors average them over the batch, which ties an image's weights to its batch).
  (Forward passes only: n² of them, not counted as gradient evaluations.)
  DRF (disagreement filter): per pixel, the cosine similarity over the colour channels between
  g_i and g_j, averaged over all pairs i ≠ j; pixels whose average is below the threshold
  (−0.3) are masked out. Every model's row enters the average (the public code leaves the last
  model's row at zero through an indexing slip).
  g = ∇ of the w-weighted ensemble loss (weighted logits by default; n evaluations), times the
  mask; MI update g_acc ← μ·g_acc + g/‖g‖₁; x ← Π(x + α·dir(g_acc)).
Cost 2n per step. Defaults: μ = 1, α = ε/T, β = 10, threshold = −0.3. With one model the
weights are 1 and nothing is masked.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .base import Attack, SurrogateCall, register_attack, take_extra
from .params import Param
from .ops import ascent_direction, normalize, project


def disagreement_mask(grads: list[torch.Tensor], threshold: float) -> torch.Tensor:
    """N×1×H×W mask: 1 where the mean pairwise per-pixel cosine similarity (over channels) of the
    members' gradients is at least ``threshold``; grads are N×C×H×W each."""
    n = len(grads)
    if n < 2:
        return torch.ones_like(grads[0][:, :1])
    unit = [F.normalize(g, dim=1, eps=1e-12) for g in grads]
    total = torch.zeros_like(grads[0][:, 0])
    for i in range(n):
        for j in range(i + 1, n):
            total += (unit[i] * unit[j]).sum(1)
    mean = total / (n * (n - 1) / 2)
    return (mean >= threshold).to(grads[0].dtype).unsqueeze(1)


RATIOS = ("authors", "mean_own")


@register_attack("adaea", kind="ensemble", version=2)
class AdaEA(Attack):
    parameters = {"momentum": Param(1.0, "number", lo=0, doc="momentum μ"),
                  "beta": Param(10.0, "number", lo=0, doc="softmax temperature of the transfer ratios"),
                  "threshold": Param(-0.3, "number", lo=-1, hi=1, doc="cosine-similarity threshold of the disagreement mask"),
                  "ratio": Param("authors", "choice", choices=RATIOS, doc="transfer-ratio form")}

    def init_extra(self, **kwargs: Any) -> dict[str, Any]:
        extra = take_extra(self, kwargs)
        return {k: (v if k == "ratio" else float(v)) for k, v in extra.items()}

    @torch.no_grad()
    def weights(self, S: SurrogateCall, x_adv: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                grads: list[torch.Tensor]) -> torch.Tensor:
        """N×n per-sample model weights from the one-step transfer ratios (AGM), on x's device."""
        n = len(grads)
        if n < 2:
            return torch.ones(len(x), 1, dtype=x.dtype, device=x.device)
        sign = -1.0 if self.targeted else 1.0
        # L[j][i]: member i's loss on x_j, the one-step example of member j; for targeted attacks
        # the loss is the target cross-entropy, which the attacker lowers (so the ratio inverts)
        L = []
        for g in grads:
            x_j = project(x_adv + self.alpha * ascent_direction(g, self.norm), x, self.eps, self.norm)
            L.append([F.cross_entropy(S.logits(x_j, i), y, reduction="none").clamp_min(1e-12) for i in range(n)])
        r = torch.zeros(len(x), n, dtype=x.dtype, device=x.device)
        for j in range(n):
            if self.extra["ratio"] == "authors":
                r[:, j] = sum((L[j][i] / L[i][i]) ** sign for i in range(n) if i != j)
            else:
                r[:, j] = (sum(L[j][i] for i in range(n) if i != j) / (n - 1) / L[j][j]) ** sign
        return torch.softmax(self.extra["beta"] * r, dim=1)

    def perturb(self, S: SurrogateCall, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        mu = self.extra["momentum"]
        n = len(S)
        x_adv, g_acc = x.clone(), torch.zeros_like(x)
        base_w = S.weights.to(x.device, x.dtype)
        for _ in range(self.steps):
            S.advance()
            grads = [S.grad(x_adv, y, idx=[j]) for j in range(n)]
            w = self.weights(S, x_adv, x, y, grads) * base_w  # grid weights act as a prior
            mask = disagreement_mask(grads, self.extra["threshold"])
            g = S.grad(x_adv, y, weights=w) * mask
            g_acc = mu * g_acc + normalize(g, 1)
            x_adv = project(x_adv + self.alpha * ascent_direction(g_acc, self.norm), x, self.eps, self.norm)
        return x_adv

    def grad_evals_formula(self, n_models: int) -> int:
        return self.steps * 2 * n_models
