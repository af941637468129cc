"""SVRE, stochastic variance-reduced ensemble attack (Xiong et al. 2022), MI variant, L∞/L2.

Per outer step t at x_t (every norm per sample):
  g_ens = ∇L_ens(x_t) (the ensemble loss: weighted logits by default), and each member's
  gradient ∇L_k(x_t) (cached, one pass per member);
  inner loop of M steps from x̃ = x_t, G̃ = 0: pick a member k at random,
      g = ∇L_k(x̃) − ∇L_k(x_t) + g_ens;  G̃ ← μ_in·G̃ + g/‖g‖₁;  x̃ ← Π(x̃ + β·dir(G̃));
  outer: G ← μ·G + G̃/‖G̃‖₁;  x_{t+1} = Π(x_t + α·dir(G)).
Defaults as in the paper: M = 4n (``inner_steps``, 0 means 4n), μ = μ_in = 1, β = α = ε/T
(``beta``, None means α).

The random member sequence depends only on the seed and the step (not on the images), so each
image's result is independent of its batch. Caching ∇L_k(x_t) makes the cost per outer step
n (g_ens) + n (members at x_t) + M, i.e. 6n with the default M (the authors' code recomputes
∇L_k(x_t) at every inner step: n + 2M).
"""
from __future__ import annotations

from typing import Any

import torch

from ..core.utils import parse_fraction
from .base import Attack, SurrogateCall, register_attack, take_extra
from .params import Param
from .ops import ascent_direction, normalize, project


@register_attack("svre", kind="ensemble", version=1)
class SVRE(Attack):
    parameters = {"momentum": Param(1.0, "number", lo=0, doc="outer momentum"),
                  "inner_momentum": Param(1.0, "number", lo=0, doc="inner momentum"),
                  "inner_steps": Param(0, "int", lo=0, doc="inner steps (0: 4 per model)"),
                  "beta": Param(None, "number", lo=0, lo_open=True, none_ok=True, doc="inner step size (null: α)")}

    def init_extra(self, **kwargs: Any) -> dict[str, Any]:
        e = take_extra(self, kwargs)
        return {"momentum": float(e["momentum"]), "inner_momentum": float(e["inner_momentum"]),
                "inner_steps": int(e["inner_steps"]),
                "beta": self.alpha if e["beta"] is None else parse_fraction(e["beta"], "beta")}

    def n_inner(self, n_models: int) -> int:
        return self.extra["inner_steps"] or 4 * n_models

    def perturb(self, S: SurrogateCall, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        mu, mu_in, beta = self.extra["momentum"], self.extra["inner_momentum"], self.extra["beta"]
        n = len(S)
        gen = self.rngs(torch.tensor([-1]), "svre-members")[0]  # image-independent sequence
        x_adv, G = x.clone(), torch.zeros_like(x)
        for _ in range(self.steps):
            S.advance()
            g_ens = S.grad(x_adv, y)
            g_at = [S.grad(x_adv, y, idx=[k]) for k in range(n)]
            x_in, G_in = x_adv.clone(), torch.zeros_like(x)
            for _ in range(self.n_inner(n)):
                k = int(torch.randint(n, (), generator=gen))
                g = S.grad(x_in, y, idx=[k]) - g_at[k] + g_ens
                G_in = mu_in * G_in + normalize(g, 1)
                x_in = project(x_in + beta * ascent_direction(G_in, self.norm), x, self.eps, self.norm)
            G = mu * G + normalize(G_in, 1)
            x_adv = project(x_adv + self.alpha * ascent_direction(G, self.norm), x, self.eps, self.norm)
        return x_adv

    def grad_evals_formula(self, n_models: int) -> int:
        return self.steps * (2 * n_models + self.n_inner(n_models))
