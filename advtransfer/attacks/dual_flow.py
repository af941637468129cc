"""Dual-Flow (Chen et al., 2025): a multi-target attack as a conditional flow. A forward flow
carries the image to an intermediate state; a reverse flow with a trained *adversarial velocity*
v_θ(x_t, t, c) carries it back, conditioned on the target class c; every predicted image is kept
in the ε-ball; θ is trained with Cascading Distribution Shift Training.

The paper's flows are those of a pretrained text-to-image diffusion model (DDIM inversion for the
forward flow; a LoRA-tuned copy for the reverse one, conditioned through its text encoder). No
such model exists here, so this is a pixel-space version that keeps the method's structure:

- forward flow: the identity (the reverse flow starts at the clean image: x_K = x). With a
  pretrained prior, inverting a few steps lands near x; without one there is no trajectory to
  follow, and noising x would only destroy the image;
- reverse flow: K Euler steps (``flow_steps``, default 4) of a conditional velocity network (the
  conditional ResNet generator with the time as an input channel and a time embedding in its
  condition tokens): x_{k−1} = Π_ε(x_k + (1/K)·ε·tanh(v_θ(x_k, t_k, c))), t_k = k/K, where Π_ε
  clips to the ε-ball around x and to [0,1] (the bound holds by construction at every step; L2
  scales the step and projects onto the L2 ball);
- Cascading Distribution Shift Training: for each batch the trajectory is rolled out step by
  step; at every step the cross-entropy of the target on that step's output is minimised with its
  own backward pass and optimiser step, and the state carried to the next step is detached — so
  later steps train on the distribution the freshly updated earlier steps produce. One batch
  therefore costs K surrogate passes per image and makes K optimiser updates.

Conditioning as in :mod:`cgnc` (``cond: label`` learned embedding, or ``cond: clip`` CLIP text
embeddings of the class names). At test time the K steps run once per image.
"""
from __future__ import annotations

from typing import Any

import torch

from .base import register_attack
from .params import Param
from .generative import CONDS, Conditioned, GenerativeAttack, step
from .generators import FlowVelocity, bound
from .ops import project


@register_attack("dual_flow", kind="generative", version=2)
class DualFlow(GenerativeAttack):
    """Multi-target conditional flow attack (targeted). Parameters besides the generator's:
    ``flow_steps`` (K), ``cond`` and ``clip`` as for cgnc. ``steps`` counts batches (each makes K
    optimiser updates)."""

    conditional = True
    default_objective = "ce"
    default_steps = 300
    parameters = {**GenerativeAttack.parameters, "cond": Param("label", "choice", choices=CONDS, doc="what conditions the flow"),
                                 "clip": Param("", "model", doc="an open_clip zoo entry (cond: clip)"),
                                 "flow_steps": Param(4, "int", lo=1, doc="flow steps")}

    def init_extra(self, **kwargs: Any) -> dict[str, Any]:
        extra = super().init_extra(**kwargs)
        return extra

    def passes_per_update(self) -> int:
        return int(self.extra["flow_steps"])

    def build(self, n_classes, table):
        dim = 64 if table is None else int(table.shape[1])
        return Conditioned(FlowVelocity(dim, self.extra["width"], self.extra["blocks"]), n_classes, dim, table)

    def flow_step(self, G, x0: torch.Tensor, xk: torch.Tensor, k: int, t: torch.Tensor) -> torch.Tensor:
        """One reverse Euler step from state xk at time k/K, kept in the ε-ball around x0."""
        K = int(self.extra["flow_steps"])
        v = bound(G(xk, t, t_time=k / K), self.eps, self.norm)
        return project(xk + v / K, x0, self.eps, self.norm)

    def generate(self, G, x, t):
        xk = x
        for k in range(int(self.extra["flow_steps"]), 0, -1):
            xk = self.flow_step(G, x, xk, k, t)
        return xk

    def update(self, G, opt, params, st, x, y, t):
        xk, total = x, 0.0
        for k in range(int(self.extra["flow_steps"]), 0, -1):
            with torch.enable_grad():
                nxt = self.flow_step(G, x, xk.detach(), k, t)
                loss = self.base_loss(st, x, nxt, y, t)
            step(opt, params, loss)
            total += float(loss.detach())
            xk = nxt.detach()
        return total / int(self.extra["flow_steps"])
