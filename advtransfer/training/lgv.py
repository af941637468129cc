"""LGV (Gubri et al. 2022): from a trained model, keep training at a constant high learning rate
and collect K weight snapshots along the way; the attack uses one snapshot per iteration.

The zoo loads the starting weights from the entry named by the recipe's ``init_from``.
"""
from __future__ import annotations

import torch.nn as nn

from ..data import Split
from ..core.errors import UserError
from .base import TrainOutput, register_method
from .context import TrainingContext
from .standard import fit, snapshot_dtype, stored_copy


def snapshot_steps(total: int, k: int) -> list[int]:
    """Optimiser steps (1-based, after the step) at which K evenly spaced snapshots are taken;
    the last one is the final step."""
    return sorted({max(1, round(total * (j + 1) / k)) for j in range(k)})


@register_method("lgv", version=1)
def train_lgv(net: nn.Module, recipe: dict, data: Split, ctx: TrainingContext) -> TrainOutput:
    """Constant learning rate ``lr`` (about 4× the usual final rate) for ``epochs`` epochs from the
    ``init_from`` weights, ``snapshots_per_epoch`` copies per epoch (members ``s00``, ``s01``, ...).

    ``snapshot_dtype: float16`` rounds each snapshot's floating-point tensors to half precision and
    keeps them so (the attack loads them into float32 modules): a collection of 40 ResNet-20s is
    22 MB instead of 44 MB, which is what lets the converged collections ship with the project.
    The rounding moves each weight by at most 2^-11 of itself; the training trajectory is the
    float32 one (only the copies are rounded). Default ``float32``, the authors' format."""
    if not recipe.get("init_from"):
        raise UserError(f"LGV recipe of {ctx.name!r} needs init_from: a trained zoo entry to start from")
    epochs = int(recipe["epochs"])
    k = epochs * int(recipe.get("snapshots_per_epoch", 4))
    dtype = snapshot_dtype(recipe, "LGV", ctx.name)
    snaps: dict = {}
    marks: list[int] = []

    def after_step(step: int, total: int, net: nn.Module, lr: float) -> None:
        if not marks:
            marks.extend(snapshot_steps(total, k))
        if step in marks:
            snaps[f"s{len(snaps):02d}"] = stored_copy(net, dtype)

    out = fit(net, {**recipe, "schedule": "constant"}, data, ctx, after_step=after_step)
    meta = {**out.meta, "surrogate_params": {"K": len(snaps), "lr": float(recipe["lr"]), "epochs": epochs,
                                             "init_from": recipe["init_from"],
                                             **({"snapshot_dtype": "float16"} if dtype is not None else {})}}
    return TrainOutput(snaps, meta)
