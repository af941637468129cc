"""TRADES (Zhang et al., 2019): cross-entropy on clean images plus β·KL(f(x) ‖ f(x')), with x'
the L∞ PGD example maximising that KL divergence."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data import Split
from ..core.errors import UserError
from .base import TrainOutput, register_method
from .context import TrainingContext
from .pgd_at import at_params, pgd_example
from .resume import ResumeHooks
from .standard import fit


@register_method("trades", version=1)
def train_trades(net: nn.Module, recipe: dict, data: Split, ctx: TrainingContext) -> TrainOutput:
    """TRADES with ``trades_beta`` (the authors' CIFAR-10 value 6), ``at_eps`` (8/255),
    ``at_steps`` (authors: 10), ``at_alpha`` (authors: 0.007 ≈ 2/255; default 2.5ε/steps). The
    inner maximisation starts from x + 0.001·N(0,1) as in the authors' code and runs in eval
    mode; the outer loss is CE(f(x), y) + β·KL(softmax f(x) ‖ softmax f(x')) per batch."""
    eps, alpha, steps = at_params(recipe, 10)
    beta = float(recipe.get("trades_beta", 6.0))
    if beta < 0:
        raise UserError(f"trades_beta must be >= 0, got {beta}")
    gen = torch.Generator().manual_seed(int(recipe.get("seed", 0)) + 7)

    def backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor, ls: float) -> torch.Tensor:
        with torch.no_grad():
            model.eval()
            p_clean = F.softmax(model(x), dim=1)
            model.train()

        def kl(logits: torch.Tensor) -> torch.Tensor:
            return F.kl_div(F.log_softmax(logits, dim=1), p_clean, reduction="sum")

        x_adv = pgd_example(model, x, y, eps, alpha, steps, gen, loss_fn=kl, start="gauss")
        logits = model(x)
        robust = F.kl_div(F.log_softmax(model(x_adv), dim=1), F.softmax(logits, dim=1), reduction="batchmean")
        loss = F.cross_entropy(logits, y, label_smoothing=ls) + beta * robust
        loss.backward()
        return loss

    # resumable: the PGD starts come from ``gen``, saved with the loop's state
    out = fit(net, recipe, data, ctx, backward=backward,
              resume_hooks=ResumeHooks(lambda: {"gen": gen.get_state()}, lambda state: gen.set_state(state["gen"])))
    out.meta.update(at_eps=eps, at_alpha=alpha, at_steps=steps, trades_beta=beta)
    out.meta["surrogate_params"] = {"epochs": int(recipe["epochs"]), "at_eps": eps, "at_steps": steps,
                                    "trades_beta": beta}
    return out
