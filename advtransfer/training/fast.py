"""Fast CIFAR-10 training: the techniques of airbench (Jordan 2024, arXiv 2404.00498; code
``KellerJordan/cifar10-airbench``, ``airbench/utils.py``), written for the harness's networks.

What it computes follows the authors' ``train()`` line by line, with these parts each switchable
from the recipe so that one net can be ablated:

- **decoupled hyper-parameters** (``lr`` and ``weight_decay`` per 1,024 examples): the loss is the
  *sum* over the batch; torch's SGD gets ``lr / (1024·(1 + 1/(1 − momentum)))`` and weight decay
  ``weight_decay · batch / (1024·(1 + 1/(1 − momentum)))`` divided by each group's lr (so the decay
  follows the schedule but not the lr); Nesterov momentum;
- **BatchNorm biases at a scaled learning rate** (``bias_scaler``, 64: the same decay);
- **label smoothing** (``label_smoothing``, 0.2);
- **schedule**: linear warm-up from 0.2× to 1× over ``warmup`` (0.23) of the steps, then linear
  decay to ``lr_end`` (0.07)×;
- **lookahead** (``lookahead: true``): every 5 steps the weights (and every float buffer:
  BatchNorm statistics) move to an exponential average with decay 0.95⁵·(step/total)³, and the
  network continues from it; the final weights are that average;
- **patch whitening**: a network with ``init_whitening`` (:class:`~advtransfer.models.archs.AirbenchNet`)
  gets its first layer from the first 5,000 training images of the subset, and that layer's bias
  trains for the first ``whiten_bias_epochs`` (3) epochs only (``whiten: false``, for an ablation:
  the layer keeps its random initialisation and trains with the rest);
- **augmentation** ``augment: [flip, translate]``: every image flipped with p = 0.5 once, then
  *alternating flip* (all images mirrored on every odd epoch: ``flip: alternate``, or a fresh
  flip per image each epoch: ``flip: random``), and a random translation of up to ``translate``
  (2) pixels with reflection padding, drawn per image each epoch;
- a large batch (``batch_size``, 1024), the last partial batch dropped; ``epochs`` may be
  fractional (the authors' 9.9): training stops after ⌈steps per epoch × epochs⌉ steps;
- ``rho`` (not airbench's; absent or 0: off): each step is a sharpness-aware one (SAM, Foret et
  al. 2021; :func:`~advtransfer.training.sam.sam_backward`): the gradient is taken at
  w + ρ·g/‖g‖₂ (one norm over every trainable tensor; BatchNorm statistics move on the first pass
  only), then the step above uses it. Two passes a step. The flat surrogates of the SAM claims at
  the converged size are the ResNet-20 recipe with this step and nothing else changed;
- ``keep_epochs: [k]`` (not airbench's) also keeps, as entry ``<name>@epoch<k>``, the weights
  training would end with if it stopped after epoch k (lookahead's average): an early-stopped
  surrogate from the same run, which leaves the final weights unchanged.

Not taken from airbench: half precision (a CPU trains in fp32), test-time augmentation (a victim
that averages over flips and shifts is a defence and would have to be declared one), and the
data loader's order of random draws (ours come from one generator seeded by the recipe's
``seed``, so the same recipe gives the same weights on any machine with the same thread count).

Resumable (:class:`~advtransfer.training.resume.ResumableRun`, the protocol the standard loop uses
too): after every epoch the run saves the network, the optimiser, the generator, torch's global
generator, the lookahead average (the method's own state), the counters and the kept checkpoints;
the zoo's next ``train`` of the same entry continues from there to the uninterrupted run's weights
(tested).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data import Split
from ..core.errors import UserError
from .base import TrainOutput, register_method, training_subset
from .context import TrainingContext
from .resume import ResumableRun, ResumeHooks
from .sam import sam_backward

_WHITEN_IMAGES = 5000
_LOOKAHEAD_EVERY = 5


def _translate(padded: torch.Tensor, size: int, r: int, gen: torch.Generator) -> torch.Tensor:
    """A random crop of ``size`` from each reflection-padded image (shift in [−r, r] per axis,
    drawn per image: airbench's ``batch_crop``)."""
    n = len(padded)
    shifts = torch.randint(-r, r + 1, (n, 2), generator=gen)
    out = torch.empty((n, padded.shape[1], size, size), dtype=padded.dtype)
    for sy in range(-r, r + 1):
        for sx in range(-r, r + 1):
            mask = (shifts[:, 0] == sy) & (shifts[:, 1] == sx)
            if mask.any():
                out[mask] = padded[mask, :, r + sy:r + sy + size, r + sx:r + sx + size]
    return out


def _lr_factor(step: int, total: int, warmup: float, lr_end: float) -> float:
    """airbench's schedule: 0.2 → 1 linearly over the first ``warmup`` of the steps, then 1 → ``lr_end``."""
    w = int(total * warmup)
    if step < w:
        f = step / w
        return 0.2 * (1 - f) + f
    f = (step - w) / max(1, total - w)
    return (1 - f) + lr_end * f


class _Lookahead:
    """airbench's ``LookaheadState``: an average of every float tensor of the state dict."""

    def __init__(self, net: nn.Module) -> None:
        self.avg = {k: v.detach().clone() for k, v in net.state_dict().items()}

    @torch.no_grad()
    def update(self, net: nn.Module, decay: float) -> None:
        for (k, avg), cur in zip(self.avg.items(), net.state_dict().values()):
            if cur.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
                avg.lerp_(cur, 1 - decay)
                cur.copy_(avg)


def _param_groups(net: nn.Module, lr: float, wd: float, bias_scaler: float) -> list[dict]:
    """BatchNorm biases at ``lr·bias_scaler``, every other trainable tensor at ``lr``; both with the
    same decoupled decay ``wd`` (torch multiplies weight_decay by the group's lr)."""
    bn_bias = {id(m.bias) for m in net.modules()
               if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.bias is not None}
    biases = [p for p in net.parameters() if id(p) in bn_bias and p.requires_grad]
    other = [p for p in net.parameters() if id(p) not in bn_bias]  # requires_grad may change (whitening bias)
    lr_b = lr * bias_scaler
    return [dict(params=biases, lr=lr_b, weight_decay=wd / lr_b, base_lr=lr_b),
            dict(params=other, lr=lr, weight_decay=wd / lr, base_lr=lr)]


def _schedule(recipe: dict, n: int) -> tuple[int, float, int, int, set[int]]:
    """The recipe's batch size, epochs (may be fractional), steps per epoch (full batches of the
    ``n`` images), total optimiser steps and the epochs whose weights are kept."""
    bs = int(recipe.get("batch_size", 1024))
    epochs = float(recipe["epochs"])
    per_epoch = n // bs
    if per_epoch < 1 or epochs <= 0:
        raise UserError(f"method fast: {n} images make no full batch of {bs} (or epochs <= 0)")
    keep = {int(e) for e in recipe.get("keep_epochs", [])}
    bad = sorted(e for e in keep if not 1 <= e <= math.floor(epochs))
    if bad:
        raise UserError(f"keep_epochs {bad} outside 1..{math.floor(epochs)} (the recipe's whole epochs)")
    return bs, epochs, per_epoch, math.ceil(per_epoch * epochs), keep


def _augmentation(recipe: dict) -> tuple[list[str], str, int]:
    """The recipe's augmentations, flip mode (``alternate`` or ``random``) and translation radius
    (pixels; 0 without ``translate``)."""
    aug = list(recipe.get("augment", ["flip", "translate"]))
    unknown = set(aug) - {"flip", "translate"}
    if unknown:
        raise UserError(f"method fast: unknown augmentation {sorted(unknown)}; use flip and/or translate")
    flip_mode = recipe.get("flip", "alternate")
    if flip_mode not in ("alternate", "random"):
        raise UserError(f"method fast: flip must be alternate or random, got {flip_mode!r}")
    return aug, flip_mode, int(recipe.get("translate", 2)) if "translate" in aug else 0


def _optimizer(net: nn.Module, recipe: dict, bs: int) -> torch.optim.SGD:
    """Nesterov SGD with airbench's decoupled ``lr`` and ``weight_decay`` (per 1,024 examples) and
    its BatchNorm-bias groups; every group keeps its unscheduled lr as ``base_lr``."""
    momentum = float(recipe.get("momentum", 0.85))
    kilostep = 1024 * (1 + 1 / (1 - momentum))
    lr = float(recipe.get("lr", 11.5)) / kilostep
    wd = float(recipe.get("weight_decay", 0.0153)) * bs / kilostep
    groups = _param_groups(net, lr, wd, float(recipe.get("bias_scaler", 64.0)))
    return torch.optim.SGD(groups, momentum=momentum, nesterov=True)


def _epoch_images(x_all: torch.Tensor, padded: torch.Tensor | None, r: int, aug: list[str], flip_mode: str,
                  epoch: int, gen: torch.Generator) -> torch.Tensor:
    """Epoch ``epoch``'s (0-based) augmented copy of the training images (N×C×H×W in [0,1]):
    translated by up to ``r`` pixels, mirrored every odd epoch (``alternate``) or per image."""
    images = _translate(padded, x_all.shape[-1], r, gen) if r else x_all
    if "flip" in aug:
        if flip_mode == "alternate":
            images = images.flip(3) if epoch % 2 == 1 else images
        else:
            f = torch.rand(len(images), generator=gen) < 0.5
            images = torch.where(f.view(-1, 1, 1, 1), images.flip(3), images)
    return images


def _lookahead_hooks(ahead: "_Lookahead | None", device: str) -> ResumeHooks:
    """The fast loop's own state for a resume: the lookahead average (None without lookahead)."""

    def get() -> dict:
        return {"ahead": _copy(ahead.avg) if ahead is not None else None}

    def set_(state: dict) -> None:
        if ahead is not None:
            ahead.avg = {k: v.to(device) for k, v in state["ahead"].items()}

    return ResumeHooks(get, set_)


@register_method("fast", version=1)
def train_fast(net: nn.Module, recipe: dict, data: Split, ctx: TrainingContext) -> TrainOutput:
    """Train ``net`` (an ImageClassifier: pixels in [0,1], N×3×32×32) on ``ctx.device`` with
    airbench's techniques (see the module docstring for each recipe key and its default)."""
    device = ctx.device
    gen = torch.Generator().manual_seed(int(recipe.get("seed", 0)))
    idx = training_subset(data, recipe)
    bs, epochs, steps_per_epoch, total, keep = _schedule(recipe, len(idx))
    ls = float(recipe.get("label_smoothing", 0.2))
    aug, flip_mode, r = _augmentation(recipe)
    inner = getattr(net, "net", net)
    whiten = hasattr(inner, "init_whitening") and bool(recipe.get("whiten", True))
    if hasattr(inner, "init_whitening") and not whiten:  # ablation: a trained first layer from its random init
        inner.whiten.weight.requires_grad_(True)
    opt = _optimizer(net, recipe, bs)
    warmup, lr_end = float(recipe.get("warmup", 0.23)), float(recipe.get("lr_end", 0.07))
    rho = float(recipe.get("rho", 0.0))
    if rho < 0:
        raise UserError(f"method fast: rho (the SAM radius) must be >= 0, got {rho}")
    sam = sam_backward(rho, reduction="sum") if rho > 0 else None

    x_all, y_all, _ = data.tensors(idx)  # pixels in [0,1]; the model normalises inside
    if whiten:
        inner.init_whitening((x_all[:_WHITEN_IMAGES] - net.mean) / net.std)
    whiten_bias_epochs = int(recipe.get("whiten_bias_epochs", 3))
    if "flip" in aug:  # one random flip per image, then the whole set mirrored every other epoch
        flip = torch.rand(len(x_all), generator=gen) < 0.5
        x_all = torch.where(flip.view(-1, 1, 1, 1), x_all.flip(3), x_all)
    padded = F.pad(x_all, (r,) * 4, mode="reflect") if r else None

    net.to(device).train()
    ahead = _Lookahead(net) if recipe.get("lookahead", True) else None
    alphas = 0.95 ** 5 * (torch.arange(total + 1) / total) ** 3
    # a resumed run restores here: the draws above were replayed and are overwritten
    run = ResumableRun(ctx, recipe, net, opt, gen, math.ceil(epochs), total, _lookahead_hooks(ahead, device))
    for epoch in run.epochs_left():
        if whiten:
            inner.whiten.bias.requires_grad_(epoch < whiten_bias_epochs)
        images = _epoch_images(x_all, padded, r, aug, flip_mode, epoch, gen)
        perm = torch.randperm(len(images), generator=gen)
        for i in range(steps_per_epoch):
            b = perm[i * bs:(i + 1) * bs]
            x, y = images[b].to(device), y_all[b].to(device)
            factor = _lr_factor(run.step, total, warmup, lr_end)
            for grp in opt.param_groups:
                grp["lr"] = grp["base_lr"] * factor
            opt.zero_grad(set_to_none=True)
            if sam is None:
                loss = F.cross_entropy(net(x), y, label_smoothing=ls, reduction="sum")
                loss.backward()
            else:
                loss = sam(net, x, y, ls)
            opt.step()
            step = run.advance()
            if ahead is not None and step % _LOOKAHEAD_EVERY == 0:
                ahead.update(net, float(alphas[step]))
            run.record(loss.item() / len(b), epoch)
            if step >= total:
                break
        # the weights stopping here would give: lookahead's average, not the fast weights
        run.end_epoch(epoch + 1, keep, lambda: _stopped_state(net, ahead))
        if run.step >= total:
            break
    if ahead is not None:
        ahead.update(net, 1.0)
    meta = run.finish()
    net.eval()
    params = {"epochs": epochs, **({"rho": rho} if rho > 0 else {})}
    return TrainOutput({"": _copy(net.state_dict())}, {**meta, "surrogate_params": params}, checkpoints=run.checkpoints)


def _copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A detached CPU copy of a state dict (the network's, or the lookahead average)."""
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def _stopped_state(net: nn.Module, ahead: "_Lookahead | None") -> dict[str, torch.Tensor]:
    """A CPU copy of the state training would end with if it stopped now (``ahead.update(net, 1.0)``
    copies the average into the weights), leaving ``net`` and the average untouched."""
    state = _copy(net.state_dict())
    if ahead is not None:
        for k, avg in ahead.avg.items():
            if avg.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
                state[k] = avg.detach().cpu().clone()
    return state
