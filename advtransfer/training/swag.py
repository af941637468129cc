"""SWAG (Maddox et al. 2019): during a late, constant-learning-rate phase started from a trained
model (``init_from``), keep the running mean θ̄ and second moment of the weights and the last R
deviations D = [θ_i − θ̄_i]. Sampling (done by the attack, see
:class:`advtransfer.models.collections.SWAGCollection`):

- diagonal: θ = θ̄ + s·√(E[θ²] − θ̄²) ⊙ z;
- low-rank (full SWAG): θ = θ̄ + s·(√½·√diag ⊙ z₁ + D·z₂/√(2(R−1))), the paper's split of the
  covariance into halves; z, z₁ ~ N(0, I), z₂ ~ N(0, I_R).

Stored members: ``mean`` (a network, BatchNorm statistics refreshed on training images),
``sqmean`` (E[θ²] of the parameters) and ``dev00``.. (the deviations). BatchNorm buffers are not
sampled: they are refreshed after each sample.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..data import Split
from ..core.errors import UserError
from .base import TrainOutput, bn_images, refresh_batchnorm, register_method
from .context import TrainingContext
from .lgv import snapshot_steps
from .standard import state_copy, fit

SWAG_MODES = ("diag", "lowrank")


@register_method("swag", version=1)
def train_swag(net: nn.Module, recipe: dict, data: Split, ctx: TrainingContext) -> TrainOutput:
    """Recipe: ``init_from``, constant ``lr``, ``epochs``, ``collect_per_epoch`` (moment updates per
    epoch), ``max_rank`` R (deviation columns kept; 0 keeps none: a diagonal-only posterior, as the
    Li et al. 2023 code stores), and the sampling defaults ``scale`` (s, 1.5 for
    attacks) and ``mode`` (diag or lowrank) that a grid may override."""
    if not recipe.get("init_from"):
        raise UserError(f"SWAG recipe of {ctx.name!r} needs init_from: a trained zoo entry to start from")
    mode = recipe.get("mode", "diag")
    if mode not in SWAG_MODES:
        raise UserError(f"SWAG mode {mode!r} is unknown; use diag or lowrank")
    epochs = int(recipe["epochs"])
    k = epochs * int(recipe.get("collect_per_epoch", 4))
    rank = int(recipe.get("max_rank", 10))
    names = [n for n, p in net.named_parameters() if p.requires_grad]
    mean = {n: torch.zeros_like(p, device="cpu") for n, p in net.named_parameters() if n in names}
    sq = {n: torch.zeros_like(v) for n, v in mean.items()}
    devs: list[dict] = []
    marks: list[int] = []
    count = [0]

    def after_step(step: int, total: int, net: nn.Module, lr: float) -> None:
        if not marks:
            marks.extend(snapshot_steps(total, k))
        if step not in marks:
            return
        count[0] += 1
        c = count[0]
        params = dict(net.named_parameters())
        for n in names:
            w = params[n].detach().cpu()
            mean[n] += (w - mean[n]) / c
            sq[n] += (w * w - sq[n]) / c
        if rank:  # (``del devs[:-0]`` would keep every column)
            devs.append({n: params[n].detach().cpu() - mean[n] for n in names})
            del devs[:-rank]

    fit(net, {**recipe, "schedule": "constant"}, data, ctx, after_step=after_step)
    with torch.no_grad():
        for n, p in net.named_parameters():
            if n in mean:
                p.copy_(mean[n].to(p.device))
    refresh_batchnorm(net, bn_images(data, recipe))
    states = {"mean": state_copy(net), "sqmean": {n: v.clone() for n, v in sq.items()}}
    states.update({f"dev{i:02d}": d for i, d in enumerate(devs)})
    meta = {"model_members": ["mean"], "n_collected": count[0],
            "surrogate_params": {"scale": float(recipe.get("scale", 1.5)), "mode": mode, "rank": len(devs),
                                 "n_collected": count[0], "lr": float(recipe["lr"]), "epochs": epochs,
                                 "init_from": recipe["init_from"]}}
    return TrainOutput(states, meta)
