"""Source-free domain adaptation by information maximisation: SHOT-IM (Liang et al., ICML 2020,
"Do we really need to access the source data?"), the adaptation AdaptGuard's experiments run.

From the source model (``init_from``), keep its classifier head (the "hypothesis") fixed and train
everything before it on the *unlabelled* target-domain images (the recipe's ``data``, e.g. a
shifted copy) to minimise

    L = E_x[H(p(x))] − H(E_x[p(x)])

per batch: confident predictions on each image (low entropy) that stay diverse over the batch
(high entropy of the mean prediction, so the model does not collapse to one class). Labels are
never read. Simplified from SHOT: no self-supervised pseudo-labelling term (β = 0: SHOT-IM, the
paper's own ablation) and the recipe's optimiser and schedule instead of SHOT's.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..data import Split
from ..core.errors import UserError
from .base import TrainOutput, classifier_head, register_method
from .context import TrainingContext
from .standard import fit

_EPS = 1e-6


def information_maximisation(logits: torch.Tensor) -> torch.Tensor:
    """SHOT-IM's loss on a batch of logits (N×K): mean per-image entropy minus the entropy of the
    mean prediction (nats)."""
    p = logits.softmax(1)
    ent = -(p * (p + _EPS).log()).sum(1).mean()
    pm = p.mean(0)
    div = -(pm * (pm + _EPS).log()).sum()
    return ent - div


@register_method("shot_im", version=1)
def train_shot_im(net: nn.Module, recipe: dict, data: Split, ctx: TrainingContext) -> TrainOutput:
    """Adapt the ``init_from`` model to the recipe's (unlabelled) data: the head frozen, the
    feature extractor (BatchNorm statistics included) trained on SHOT-IM's loss."""
    if not recipe.get("init_from"):
        raise UserError(f"shot_im recipe of {ctx.name!r} needs init_from: the source model to adapt")
    for p in classifier_head(net).parameters():
        p.requires_grad_(False)

    def backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor, ls: float) -> torch.Tensor:
        loss = information_maximisation(model(x))  # y (the labels) deliberately unused
        loss.backward()
        return loss

    out = fit(net, recipe, data, ctx, backward=backward)
    out.meta["surrogate_params"] = {"epochs": int(recipe["epochs"]), "init_from": recipe["init_from"],
                                    "adaptation": "shot_im"}
    return out
