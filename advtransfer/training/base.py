"""Shared training machinery: batches, augmentation, schedules, the trainer registry."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.nn as nn

from ..data import Split
from ..core.errors import UserError
from ..core.registry import Registry
from ..core.rng import seeded
from .context import TrainingContext


@dataclass
class TrainOutput:
    """What a trainer returns: one or more weight sets (a collection) and metadata for the card.

    ``states`` maps a member name to a state dict; a single model uses the name ``""``.
    ``checkpoints`` maps ``epoch<k>`` to the state after epoch k (recipe ``keep_epochs``); the zoo
    stores each as its own entry ``<name>@epoch<k>`` (an early-stopped surrogate).
    ``meta['model_members']`` may list the members that are networks (SWAG also stores moments);
    ``meta['surrogate_params']`` holds the method's parameters for the results table.
    """

    states: dict[str, dict[str, torch.Tensor]]
    meta: dict[str, Any] = field(default_factory=dict)
    checkpoints: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)


#: ``fn(net, recipe, data, ctx) -> TrainOutput``: the recipe is only the hashed recipe; the run's
#: name, device, progress flag, resume file and loaded sources come in ``ctx``
Trainer = Callable[[nn.Module, dict, Split, TrainingContext], TrainOutput]
TRAINERS: Registry[Trainer] = Registry("training method")


def register_method(name: str, version: int) -> Callable[[Trainer], Trainer]:
    """Decorator: register a trainer as recipe ``method: name`` with its ``VERSION``.

    Bump ``version`` whenever a code change makes the method produce different weights for the
    same recipe: the version enters every recipe hash of the method (models trained by an older
    version become stale and retrain) and the card (``method_version``).
    """

    def deco(fn: Trainer) -> Trainer:
        if not isinstance(version, int) or version < 1:
            raise ValueError(f"training method {name!r}: VERSION must be a positive int, got {version!r}")
        fn.VERSION = version  # type: ignore[attr-defined]
        return TRAINERS.register(name)(fn)

    return deco


def method_version(method: str) -> int:
    """The ``VERSION`` of training method ``method`` (UserError for an unknown method)."""
    return int(getattr(TRAINERS.get(method), "VERSION"))


def augment_batch(x: torch.Tensor, gen: torch.Generator, ops: list[str]) -> torch.Tensor:
    """Standard CIFAR augmentation on a float batch N×C×H×W in [0,1]: ``crop`` (pad 4, random
    32×32 crop) and ``flip`` (horizontal, p = 0.5), drawn per image from ``gen``."""
    n, _, h, w = x.shape
    if "crop" in ops:
        pad = 4
        xp = torch.nn.functional.pad(x, (pad, pad, pad, pad))
        offs = torch.randint(0, 2 * pad + 1, (n, 2), generator=gen).tolist()
        x = torch.stack([xp[i, :, dy:dy + h, dx:dx + w] for i, (dy, dx) in enumerate(offs)])
    if "flip" in ops:
        flip = torch.rand(n, generator=gen) < 0.5
        x = torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)
    unknown = set(ops) - {"crop", "flip"}
    if unknown:
        raise UserError(f"unknown augmentation {sorted(unknown)}; use crop and/or flip")
    return x


def training_subset(data: Split, recipe: dict) -> np.ndarray:
    """Indices of the training images a recipe uses: the first ``train_subset`` (all if absent)."""
    n = int(recipe.get("train_subset") or len(data))
    if n > len(data):
        raise UserError(f"train_subset={n} exceeds the {len(data)} training images")
    return np.arange(n)


def batches(data: Split, idx: np.ndarray, batch_size: int, gen: torch.Generator, augment: list[str]
            ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of shuffled, augmented batches ``(x [0,1] N×C×H×W, y)``; the last partial batch is dropped
    when it is smaller than half a batch (keeps BatchNorm statistics sane)."""
    perm = idx[torch.randperm(len(idx), generator=gen).numpy()]
    for s in range(0, len(perm), batch_size):
        b = perm[s:s + batch_size]
        if len(b) < max(2, batch_size // 2) and s > 0:
            break
        x, y, _ = data.tensors(b)
        yield augment_batch(x, gen, augment), y


def steps_per_epoch(n: int, batch_size: int) -> int:
    full, rest = divmod(n, batch_size)
    return full + (1 if rest >= max(2, batch_size // 2) or full == 0 else 0)


def lr_at(step: int, total: int, recipe: dict) -> float:
    """Learning rate at optimiser step ``step`` of ``total`` for the recipe's ``schedule``:
    ``onecycle`` (linear warm-up over ``warmup`` of the run, then linear decay to 0), ``cosine``,
    ``step`` (×0.1 at 50% and 75%) or ``constant``."""
    lr = float(recipe["lr"])
    sched = recipe.get("schedule", "onecycle")
    t = step / max(1, total)
    if sched == "onecycle":
        warm = float(recipe.get("warmup", 0.15))
        return lr * (t / warm if t < warm else max(0.0, (1 - t) / (1 - warm)))
    if sched == "cosine":
        return 0.5 * lr * (1 + math.cos(math.pi * t))
    if sched == "step":
        return lr * (0.1 ** (int(t >= 0.5) + int(t >= 0.75)))
    if sched == "constant":
        return lr
    raise UserError(f"unknown schedule {sched!r}; use onecycle, cosine, step or constant")


def make_optimizer(params: Any, recipe: dict) -> torch.optim.Optimizer:
    """SGD (momentum, Nesterov) or AdamW from the recipe."""
    opt = recipe.get("optimizer", "sgd")
    wd = float(recipe.get("weight_decay", 5e-4))
    if opt == "sgd":
        mom = float(recipe.get("momentum", 0.9))
        return torch.optim.SGD(params, lr=float(recipe["lr"]), momentum=mom, weight_decay=wd,
                               nesterov=bool(recipe.get("nesterov", mom > 0)))
    if opt == "adamw":
        return torch.optim.AdamW(params, lr=float(recipe["lr"]), weight_decay=wd)
    raise UserError(f"unknown optimizer {opt!r}; use sgd or adamw")


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 500,
             device: str = "cpu") -> float:
    """Top-1 accuracy of ``model`` (eval mode) on pixels ``x`` in [0,1]."""
    from ..core.metrics import labels

    was = model.training
    model.eval()
    pred = labels(model, x, batch_size, device)
    model.train(was)
    return float((pred == y).sum()) / len(x)


def train_from_recipe(net: nn.Module, recipe: dict, data: Split, ctx: TrainingContext | None = None
                      ) -> TrainOutput:
    """Dispatch to the trainer named by ``recipe['method']`` (default ``standard``) with the run's
    context ``ctx`` (default: :class:`~.context.TrainingContext` on the CPU, with progress, no
    resume file, no sources). Runs with torch's global RNG seeded to the recipe's ``seed`` and
    restores the caller's state afterwards (see :func:`advtransfer.core.rng.seeded`)."""
    ctx = TrainingContext() if ctx is None else ctx
    if not isinstance(ctx, TrainingContext):
        raise TypeError(f"train_from_recipe takes a TrainingContext (device and progress are its fields), "
                        f"got {type(ctx).__name__}")
    bad = sorted(k for k in recipe if str(k).startswith("_"))
    if bad:  # the run-time facts that rode in the recipe before the context existed
        raise TypeError(f"recipe keys {bad}: a recipe holds no run-time state; pass it in the TrainingContext")
    method = recipe.get("method", "standard")
    trainer = TRAINERS.get(method)
    with seeded(int(recipe.get("seed", 0)), ctx.device):
        return trainer(net, recipe, data, ctx)


def classifier_head(net: nn.Module) -> nn.Linear:
    """The network's classifier head: its last ``nn.Linear`` (every registered architecture ends in one)."""
    heads = [m for m in net.modules() if isinstance(m, nn.Linear)]
    if not heads:
        raise UserError("this architecture has no linear classifier head to fine-tune or keep fixed")
    return heads[-1]


def freeze(net: nn.Module, keep: nn.Module | None = None) -> None:
    """Freeze every parameter of ``net`` outside ``keep`` and hold every module outside it in eval
    mode (BatchNorm statistics and dropout fixed), even when ``net.train()`` is called later: a
    linear probe trains the head on the frozen features only."""
    inside = set(keep.modules()) if keep is not None else set()
    for m in net.modules():
        if m in inside:
            continue
        for p in m.parameters(recurse=False):
            p.requires_grad_(False)
        if m is not net and not any(True for _ in m.children()):
            m.train = (lambda mod: (lambda mode=True: nn.Module.train(mod, False)))(m)  # type: ignore[method-assign]
            m.eval()


@torch.no_grad()
def refresh_batchnorm(net: nn.Module, x: torch.Tensor, batch_size: int = 256) -> nn.Module:
    """Recompute every BatchNorm's running mean/variance as the plain average over ``x`` (pixels in
    [0,1], N×C×H×W) in train mode; leaves ``net`` in eval mode. Needed after weights are averaged
    or sampled (SWAG), whose stored statistics belong to other weights."""
    bns = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return net.eval()
    saved = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the batches below
    net.train()
    dev = next(net.parameters()).device
    for s in range(0, len(x), batch_size):
        net(x[s:s + batch_size].to(dev))
    for m, mom in zip(bns, saved):
        m.momentum = mom
    return net.eval()


def bn_images(data: Split, recipe: dict, n: int = 2048) -> torch.Tensor:
    """The first ``n`` training images of the recipe's subset (no augmentation), for BN refresh."""
    idx = training_subset(data, recipe)[:n]
    return data.tensors(idx)[0]
