"""VMI-FGSM (Wang & He 2021): MI-FGSM with variance tuning."""
from __future__ import annotations

import torch

from .base import SurrogateCall, register_attack
from .params import Param
from .iterative import IterativeAttack
from .ops import ascent_direction, momentum_term, project


@register_attack("vmifgsm", kind="gradient", version=1)
class VMIFGSM(IterativeAttack):
    """Each step uses ∇ + v, where v is the previous step's mean gradient at ``n_samples`` points
    drawn uniformly in a β·ε cube around x_t minus the gradient at x_t (N = 20, β = 1.5 as in the
    paper). Neighbours are not clipped to [0,1], as in the authors' code. Cost: T·(1+N)·n."""

    default_momentum = 1.0
    parameters = {**IterativeAttack.parameters, "n_samples": Param(20, "int", lo=1, doc="neighbours N"),
                      "beta": Param(1.5, "number", lo=0, doc="neighbourhood radius as a multiple of ε")}

    def perturb(self, S: SurrogateCall, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        mu = self.extra["momentum"]
        n, beta = int(self.extra["n_samples"]), float(self.extra["beta"])
        gens = self.rngs(index, "vmi")
        x_adv = x.clone()
        g_acc = torch.zeros_like(x)
        v = torch.zeros_like(x)
        radius = beta * self.eps
        for _ in range(self.steps):
            S.advance()
            g = S.grad(x_adv, y)
            g_acc = mu * g_acc + momentum_term(g + v)
            gv = torch.zeros_like(x)
            for _ in range(n):
                noise = torch.stack([torch.rand(x.shape[1:], generator=gen) for gen in gens]) * 2 - 1
                gv += S.grad(x_adv + radius * noise.to(x), y)
            v = gv / n - g
            x_adv = project(x_adv + self.alpha * ascent_direction(g_acc, self.norm), x, self.eps, self.norm)
        return x_adv

    def grad_evals_formula(self, n_models: int) -> int:
        return self.steps * (1 + int(self.extra["n_samples"])) * n_models
