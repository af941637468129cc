"""Standard SGD training and FGSM adversarial training with random start (Wong et al., 2020)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data import Split
from ..core.errors import UserError
from ..core.rng import seeded
from ..core.utils import parse_fraction
from .base import (TrainOutput, batches, classifier_head, freeze, lr_at, make_optimizer, steps_per_epoch,
                   register_method, training_subset)
from .context import TrainingContext
from .resume import STATELESS, ResumableRun, ResumeHooks


def fgsm_rs_example(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, alpha: float,
                    gen: torch.Generator) -> torch.Tensor:
    """FGSM with a uniform random start (pixels in [0,1], ε as a fraction like 8/255): the
    adversarial training example of "Fast is better than free" (α = 1.25ε there)."""
    delta = (torch.rand(x.shape, generator=gen) * 2 - 1).to(x.device) * eps
    delta.requires_grad_(True)
    loss = F.cross_entropy(model((x + delta).clamp(0, 1)), y)
    (g,) = torch.autograd.grad(loss, delta)
    delta = (delta.detach() + alpha * g.sign()).clamp(-eps, eps)
    return (x + delta).clamp(0, 1).detach()


def fit(net: nn.Module, recipe: dict, data: Split, ctx: TrainingContext,
        make_batch=None, on_epoch_end=None, backward=None, lr_fn=None, after_step=None,
        resume_hooks: ResumeHooks | None = None) -> TrainOutput:
    """The SGD loop shared by recipes: per-step learning-rate schedule, augmentation, progress bar
    (``ctx.progress``), on ``ctx.device``.

    ``make_batch(x, y, gen)`` may replace the clean batch (adversarial training);
    ``on_epoch_end(epoch, net)`` may record checkpoints; ``backward(net, x, y, label_smoothing)``
    may replace the forward/backward pass (it fills ``.grad`` and returns the loss: SAM);
    ``lr_fn(step, total)`` may replace the recipe's schedule (cSGLD); ``after_step(step, total,
    net, lr)`` runs after each optimiser step (Langevin noise, LGV snapshots, SWAG moments).
    A recipe continuing from another entry (``init_from``) fine-tunes it: ``finetune: full``
    (default) trains every weight, ``finetune: linear`` the classifier head only, on frozen features
    (BatchNorm statistics held). A recipe's ``noise_sigma`` adds Gaussian noise of that standard deviation (pixel units, not
    clipped) to every training input: the training of randomized smoothing's base (Cohen et al.).
    Torch's global RNG (dropout, ...) is seeded to the recipe's ``seed`` inside and the caller's
    state is restored afterwards.

    Resumable (:class:`~advtransfer.training.resume.ResumableRun`): with ``resume_hooks`` (the
    method's own state; :data:`~advtransfer.training.resume.STATELESS` when its hooks keep none)
    and a ``ctx.resume`` path, the loop's state is saved after every epoch and a run finding that
    file continues from it, to the same weights an uninterrupted run gives.
    """
    with seeded(int(recipe.get("seed", 0)), ctx.device):
        return _fit(net, recipe, data, ctx, make_batch, on_epoch_end, backward, lr_fn, after_step, resume_hooks)


def _fine_tuned_params(net: nn.Module, recipe: dict) -> list[nn.Parameter]:
    """The parameters the recipe's ``finetune`` mode trains (``linear``: freezes all but the head)."""
    mode = recipe.get("finetune", "full")
    if mode not in ("full", "linear"):
        raise UserError(f"finetune must be full (every weight trains) or linear (the head only), got {mode!r}")
    if mode == "linear":
        if not recipe.get("init_from"):
            raise UserError("finetune: linear trains the head on frozen features; it needs init_from")
        freeze(net, classifier_head(net))
    return [p for p in net.parameters() if p.requires_grad]


def _fit(net: nn.Module, recipe: dict, data: Split, ctx: TrainingContext,
         make_batch, on_epoch_end, backward, lr_fn, after_step, resume_hooks) -> TrainOutput:
    device = ctx.device
    gen = torch.Generator().manual_seed(int(recipe.get("seed", 0)))
    idx = training_subset(data, recipe)
    bs = int(recipe.get("batch_size", 128))
    epochs = int(recipe["epochs"])
    aug = list(recipe.get("augment", ["crop", "flip"]))
    noise = float(recipe.get("noise_sigma", 0.0))
    if noise < 0:
        raise UserError(f"noise_sigma must be >= 0, got {noise}")
    opt = make_optimizer(_fine_tuned_params(net, recipe), recipe)
    total = epochs * steps_per_epoch(len(idx), bs)
    net.to(device).train()
    keep = {int(e) for e in recipe.get("keep_epochs", [])}
    bad = sorted(e for e in keep if not 1 <= e <= epochs)
    if bad:
        raise UserError(f"keep_epochs {bad} outside 1..{epochs} (the recipe's epochs)")
    ls = float(recipe.get("label_smoothing", 0.0))
    run = ResumableRun(ctx, recipe, net, opt, gen, epochs, total, resume_hooks)
    for epoch in run.epochs_left():
        for x, y in batches(data, idx, bs, gen, aug):
            x, y = x.to(device), y.to(device)
            if make_batch is not None:
                x = make_batch(x, y, gen)
            if noise:
                x = x + noise * torch.randn(x.shape, generator=gen).to(x.device)
            for grp in opt.param_groups:
                grp["lr"] = lr = lr_at(run.step, total, recipe) if lr_fn is None else lr_fn(run.step, total)
            opt.zero_grad(set_to_none=True)
            if backward is None:
                loss = F.cross_entropy(net(x), y, label_smoothing=ls)
                loss.backward()
            else:
                loss = backward(net, x, y, ls)
            opt.step()
            step = run.advance()
            if after_step is not None:
                after_step(step, total, net, lr)
            run.record(loss.item(), epoch)
        if on_epoch_end is not None:
            on_epoch_end(epoch + 1, net)
        run.end_epoch(epoch + 1, keep, lambda: state_copy(net))
    meta = run.finish()
    net.eval()
    return TrainOutput({"": state_copy(net)}, meta, checkpoints=run.checkpoints)


def state_copy(net: nn.Module) -> dict[str, torch.Tensor]:
    """A detached CPU copy of ``net``'s state dict."""
    return {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}


#: how a collection's weight sets may be stored (``snapshot_dtype`` of an LGV or cSGLD recipe)
SNAPSHOT_DTYPES = {"float32": None, "float16": torch.float16}


def snapshot_dtype(recipe: dict, method: str, name: str = "?") -> torch.dtype | None:
    """The recipe's ``snapshot_dtype`` (default ``float32``, kept as trained: ``None``), or a
    UserError naming the recipe (of entry ``name``) and the accepted values."""
    stored = recipe.get("snapshot_dtype", "float32")
    if stored not in SNAPSHOT_DTYPES:
        raise UserError(f"{method} recipe of {name!r}: snapshot_dtype {stored!r} "
                        f"is not one of {sorted(SNAPSHOT_DTYPES)}")
    return SNAPSHOT_DTYPES[stored]


def stored_copy(net: nn.Module, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """:func:`state_copy`, its floating-point tensors rounded to ``dtype`` when one is given (the
    training run itself stays in float32: only the copy is rounded)."""
    state = state_copy(net)
    if dtype is None:
        return state
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


@register_method("standard", version=1)
def train_standard(net: nn.Module, recipe: dict, data: Split, ctx: TrainingContext) -> TrainOutput:
    """Plain supervised training with the recipe's optimiser and schedule; ``keep_epochs`` stores
    early-stopped checkpoints as entries ``<name>@epoch<k>``."""
    out = fit(net, recipe, data, ctx, resume_hooks=STATELESS)
    out.meta["surrogate_params"] = {"epochs": int(recipe["epochs"])}
    return out


@register_method("fgsm_at", version=1)
def train_fgsm_at(net: nn.Module, recipe: dict, data: Split, ctx: TrainingContext) -> TrainOutput:
    """FGSM adversarial training with random start: ``at_eps`` (default 8/255), ``at_alpha``
    (default 1.25·at_eps). Produces the defended victim."""
    eps = parse_fraction(recipe.get("at_eps", "8/255"))
    alpha = parse_fraction(recipe.get("at_alpha", 1.25 * eps))

    def make_batch(x: torch.Tensor, y: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        return fgsm_rs_example(net, x, y, eps, alpha, gen)

    out = fit(net, recipe, data, ctx, make_batch=make_batch, resume_hooks=STATELESS)
    out.meta.update(at_eps=eps, at_alpha=alpha)
    return out
