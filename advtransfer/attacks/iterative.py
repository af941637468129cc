"""The iterative sign-gradient family (I-FGSM, MI, NI, DI, TI, VMI) shares one loop."""
from __future__ import annotations

from typing import Any, Callable

import torch

from .base import Attack, SurrogateCall, take_extra
from .params import Param
from .ops import ascent_direction, momentum_term, project, random_in_ball


class IterativeAttack(Attack):
    """x_{t+1} = Π(x_t + α·dir(d_t)), where d_t is the (transformed) gradient, or with momentum μ
    the accumulated g ← μ·g + ∇/mean|∇| (per sample; see ops.momentum_term). dir is sign for L∞ and ∇/‖∇‖₂ for L2.

    Subclasses override :meth:`gradient` (where and how the gradient is taken) and set the
    class defaults ``default_momentum``, ``nesterov``, ``random_start``.
    """

    default_momentum = 0.0
    nesterov = False
    random_start = False
    #: ``momentum: None`` means the class default (``default_momentum``)
    parameters = {"momentum": Param(None, "number", lo=0, none_ok=True, doc="momentum μ (null: the attack's default)")}

    def init_extra(self, **kwargs: Any) -> dict[str, Any]:
        extra = take_extra(self, kwargs)
        mu = self.default_momentum if extra["momentum"] is None else float(extra["momentum"])
        extra["momentum"] = mu
        return extra

    def setup(self, x: torch.Tensor, index: torch.Tensor) -> Any:
        """The call's state the gradient needs (e.g. a transform holding one random generator per
        image), made once per call from the images x (N×C×H×W in [0,1]) and their dataset indices,
        and handed to :meth:`gradient`; never kept on the attack. None by default."""
        return None

    def input_transform(self, state: Any) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The transform applied to x before each forward pass (from the call's ``state``), or None."""
        return None

    def gradient(self, S: SurrogateCall, x_adv: torch.Tensor, y: torch.Tensor, state: Any) -> torch.Tensor:
        """The step's gradient at x_adv (N×C×H×W), given the call's ``state`` from :meth:`setup`."""
        return S.grad(x_adv, y, transform=self.input_transform(state))

    def transform_gradient(self, g: torch.Tensor) -> torch.Tensor:
        return g

    def perturb(self, S: SurrogateCall, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return self.iterate(S, x, y, index, self.setup(x, index))

    def iterate(self, S: SurrogateCall, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor,
                state: Any) -> torch.Tensor:
        """The step loop from x (N×C×H×W in [0,1]) with the call's ``state``; returns x_adv."""
        mu = self.extra["momentum"]
        x_adv = random_in_ball(x, self.eps, self.norm, self.rngs(index, "start")) if self.random_start else x.clone()
        g_acc = torch.zeros_like(x)
        for _ in range(self.steps):
            S.advance()
            point = x_adv + self.alpha * mu * g_acc if self.nesterov else x_adv
            g = self.transform_gradient(self.gradient(S, point, y, state))
            if mu > 0 or self.nesterov:
                g_acc = mu * g_acc + momentum_term(g)
                d = g_acc
            else:
                d = g
            x_adv = project(x_adv + self.alpha * ascent_direction(d, self.norm), x, self.eps, self.norm)
        return x_adv


class CopyAveragedAttack(IterativeAttack):
    """MI-FGSM whose gradient at each step is the mean over C copies of the input gradient taken
    through a transform T_c: g = (1/C)·Σ_c ∇_x L(T_c(x)) (SIM, SSA, BSR). Subclasses give
    :meth:`copy_transforms`, one callable per copy for the current step. Cost: T·C per model."""

    default_momentum = 1.0

    def n_copies(self) -> int:
        raise NotImplementedError

    def copy_transforms(self, state: Any) -> list[Callable[[torch.Tensor], torch.Tensor]]:
        """One transform per copy for the current step, from the call's ``state``."""
        raise NotImplementedError

    def gradient(self, S: SurrogateCall, x_adv: torch.Tensor, y: torch.Tensor, state: Any) -> torch.Tensor:
        ts = self.copy_transforms(state)
        g = torch.zeros_like(x_adv)
        for t in ts:
            g += S.grad(x_adv, y, transform=t)
        return g / len(ts)

    def grad_evals_formula(self, n_models: int) -> int:
        return self.steps * self.n_copies() * n_models
