"""Resumable training: the SGD loop's state at the end of each epoch, so that a training run cut
off (a session's end, a kill, a reboot) continues where it stopped rather than from the start.

A converged surrogate can take hours on 2 cores, more than one sitting (the measured costs are in
claims/README.md and the models' cards).
The protocol is written once, in :class:`ResumableRun`, which both training loops
(:func:`advtransfer.training.standard.fit` and airbench's loop, :mod:`advtransfer.training.fast`)
drive: after every epoch it writes one file holding everything the rest of the run depends on: the
network's and the optimiser's state, the data-order and augmentation generator, torch's global
generator (and CUDA's on a GPU), the step and epoch counters, the kept checkpoints, and the
method's own state (cSGLD's samples and noise generator, the fast loop's lookahead average, via
:class:`ResumeHooks`). Restarting the same entry loads it, restores all of it and runs the
remaining epochs, so the weights are bit-identical to an uninterrupted run on the same machine and
thread count (tested for both loops), and the card's ``meta.resumed_at_epochs`` says that it was
resumed and where.

The file lives in the cache beside the weights (``zoo/<size>/.resume/<name>-<recipe hash>.pt``,
the zoo passes it as :attr:`~advtransfer.training.context.TrainingContext.resume`), never in the
shipped zoo: a half-trained model is never a model. It is read with
``torch.load(weights_only=True)``; one from another recipe, or unreadable, is set aside with a
line on stderr and the run starts from the beginning. The zoo deletes it once the card is written.
The trained defences (TRADES, ensemble adversarial training, PubDef, DVERGE) save their own
generators (PGD starts, source picks, DVERGE's pairings and layer) as their hooks' state. The
methods of the standard loop that keep collections or other state (LGV and SWAG, whose hooks keep
collections; SHOT) pass no hooks and train in one go.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from ..core import faults
from ..core.utils import atomic_path
from .context import TrainingContext

#: bump when the file's layout changes (an older file is then set aside, not misread)
FORMAT = 1


@dataclass(frozen=True)
class ResumeHooks:
    """A method's own training state beyond the loop's: ``get()`` returns it as tensors, numbers,
    strings, lists and dicts (what ``torch.load(weights_only=True)`` reads back), ``set(state)``
    restores it before the remaining epochs run."""

    get: Callable[[], dict[str, Any]]
    set: Callable[[dict[str, Any]], None]


#: for methods whose hooks hold no state across steps (standard, SAM, FGSM/PGD adversarial training)
STATELESS = ResumeHooks(get=dict, set=lambda state: None)


def recipe_identity(recipe: dict) -> str:
    """The recipe as the resume file records it: every key not starting with ``_`` (files written
    while the run-time facts rode in the recipe under such keys recorded the recipe without them;
    they are in the :class:`~advtransfer.training.context.TrainingContext` now)."""
    return json.dumps({k: v for k, v in recipe.items() if not str(k).startswith("_")}, sort_keys=True, default=str)


def saved_epoch(path: str | Path) -> int | None:
    """The epoch after which the state at ``path`` was saved, or None when there is no readable
    state there (``zoo list`` shows it; a state from another recipe is keyed by another hash)."""
    try:
        state = torch.load(Path(path), map_location="cpu", weights_only=True)
        return int(state["epoch"]) if state.get("format") == FORMAT else None
    except Exception:  # absent, damaged or not a state file: nothing to resume
        return None


def continue_from(saved: dict[str, Any], name: str, epochs: int) -> tuple[int, int, Any, dict, list[int]]:
    """The loop counters of a loaded state: the epoch it was saved after, the step, the loss average,
    the kept checkpoints and the epochs resumed at (this one added), after one line on stderr
    saying that ``name`` resumes and where (``epochs``: the run's whole epochs)."""
    start = int(saved["epoch"])
    print(f"advtransfer: {name} resumes after epoch {start} of {epochs} "
          f"(state saved by an earlier run that did not finish)", file=sys.stderr)
    return start, int(saved["step"]), saved["loss_ema"], dict(saved["checkpoints"]), [*saved["resumed"], start]


def elapsed_so_far(earlier: float | None, t_sitting: float) -> float | None:
    """Seconds of training up to now over every sitting: ``earlier`` (the saved state's, None when
    a state written before the count existed was resumed: then unknown) plus this sitting's since
    ``t_sitting`` (a ``time.perf_counter()`` reading)."""
    return None if earlier is None else earlier + time.perf_counter() - t_sitting


class ResumeFile:
    """The resume state of one training run at ``path`` (see the module docstring)."""

    def __init__(self, path: str | Path, recipe: dict) -> None:
        self.path = Path(path)
        self.recipe = recipe_identity(recipe)

    def load(self) -> dict[str, Any] | None:
        """The saved state, or None when there is none; a file from another recipe or format, or
        an unreadable one, is renamed ``*.stale`` (kept for inspection) with one line on stderr.
        A temporary file left by a kill in the middle of :meth:`save` is removed."""
        if self.path.parent.is_dir():
            for tmp in self.path.parent.glob(f".{self.path.name}.*"):
                tmp.unlink(missing_ok=True)
        if not self.path.is_file():
            return None
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
            why = None if state.get("format") == FORMAT and state.get("recipe") == self.recipe else \
                "written for another recipe or format"
        except Exception as exc:  # a damaged or truncated file: torch raises several types
            state, why = None, f"unreadable ({type(exc).__name__})"
        if why is None:
            return state
        stale = self.path.with_suffix(".stale")
        self.path.replace(stale)
        print(f"advtransfer: resume state {self.path.name} is {why}; training from the start "
              f"(the file is kept as {stale.name})", file=sys.stderr)
        return None

    def save(self, state: dict[str, Any]) -> None:
        """Write ``state`` (with the format and recipe) atomically: a kill mid-write leaves the
        previous epoch's file."""
        with atomic_path(self.path) as tmp:
            torch.save({**state, "format": FORMAT, "recipe": self.recipe}, tmp)


#: the loop's own entries of a saved state; the method's state is under ``extra`` (a file of this
#: format written by the fast loop before both loops shared :class:`ResumableRun` kept its
#: lookahead average at the top level instead: every other entry is then the method's state)
LOOP_KEYS = frozenset({"epoch", "step", "loss_ema", "net", "opt", "gen", "torch_rng", "cuda_rng", "checkpoints",
                       "extra", "resumed", "elapsed", "format", "recipe"})


class ResumableRun:
    """The resume protocol and the counters of one training loop, written once for every loop.

    Made after the loop has built its network (on ``ctx.device``), optimiser and data generator
    and made every draw that precedes its first epoch: when ``hooks`` is given (the method's own
    state; :data:`STATELESS` when it keeps none) and ``ctx.resume`` names a file holding a state of
    this recipe, it restores the network, optimiser, generator, torch's global (and CUDA's)
    generator, the method's state and the counters from it, so every later draw is the
    uninterrupted run's. ``epochs`` is the number of epochs the loop runs (a fractional last one
    counted whole), ``total`` its optimiser steps (the progress bar's length).

    The loop iterates :meth:`epochs_left`, calls :meth:`advance` after each optimiser step and
    :meth:`record` with the step's loss, :meth:`end_epoch` after each epoch (keeps a checkpoint,
    saves the state) and :meth:`finish` at the end (the counters for the card's ``meta``).
    """

    def __init__(self, ctx: TrainingContext, recipe: dict, net: nn.Module, opt: torch.optim.Optimizer,
                 gen: torch.Generator, epochs: int, total: int, hooks: ResumeHooks | None) -> None:
        self.ctx, self.net, self.opt, self.gen, self.hooks = ctx, net, opt, gen, hooks
        self.epochs = epochs
        self.file = ResumeFile(ctx.resume, recipe) if hooks is not None and ctx.resume is not None else None
        self.start, self.step, self.loss_ema = 0, 0, None
        self.checkpoints: dict[str, dict[str, torch.Tensor]] = {}
        self.resumed: list[int] = []
        self.earlier: float | None = 0.0  # seconds of the earlier sittings (None: not recorded by them)
        self._t_sitting = time.perf_counter()
        saved = self.file.load() if self.file is not None else None
        if saved is not None:
            self._restore(saved)
        # created after a resume so that its rate and time left count this sitting's steps only
        self.bar = tqdm(total=total, initial=self.step, desc=ctx.name, unit="step", disable=not ctx.progress,
                        leave=False, mininterval=1.0)

    def _restore(self, saved: dict[str, Any]) -> None:
        """Load the state saved after epoch ``saved['epoch']`` into the run."""
        self.net.load_state_dict(saved["net"])
        self.opt.load_state_dict(saved["opt"])
        self.gen.set_state(saved["gen"])
        if saved.get("torch_rng") is not None:  # absent from the fast loop's files of before
            torch.set_rng_state(saved["torch_rng"])
        if saved.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(saved["cuda_rng"])
        assert self.hooks is not None  # a state is only loaded for a run with hooks
        self.hooks.set(saved["extra"] if "extra" in saved else {k: v for k, v in saved.items() if k not in LOOP_KEYS})
        self.start, self.step, self.loss_ema, self.checkpoints, self.resumed = continue_from(
            saved, self.ctx.name, self.epochs)
        self.earlier = saved.get("elapsed")

    def epochs_left(self) -> Iterator[int]:
        """The 0-based epochs still to run, each announced to :func:`advtransfer.core.faults.point`
        (``epoch_start``: where a test, or ``ADVTRANSFER_KILL_AT``, cuts the run)."""
        for epoch in range(self.start, self.epochs):
            faults.point("epoch_start")
            yield epoch

    def advance(self) -> int:
        """Count one optimiser step; returns the steps taken so far."""
        self.step += 1
        return self.step

    def record(self, loss: float, epoch: int) -> None:
        """Fold a step's loss (per example) into the running average shown by the bar."""
        self.loss_ema = loss if self.loss_ema is None else 0.95 * self.loss_ema + 0.05 * loss
        self.bar.update(1)
        self.bar.set_postfix(epoch=epoch + 1, loss=f"{self.loss_ema:.3f}", refresh=False)

    def end_epoch(self, done: int, keep: set[int], stopped: Callable[[], dict[str, torch.Tensor]]) -> None:
        """After epoch ``done`` (1-based): keep ``stopped()`` (the weights training would end with
        if it stopped here) as checkpoint ``epoch<done>`` when ``done`` is in ``keep``, then save
        the state when the run is resumable."""
        if done in keep:
            self.checkpoints[f"epoch{done}"] = stopped()
        if self.file is None:
            return
        assert self.hooks is not None
        on_cuda = str(self.ctx.device).startswith("cuda")
        self.file.save({"epoch": done, "step": self.step, "loss_ema": self.loss_ema,
                        "net": {k: v.detach().cpu().clone() for k, v in self.net.state_dict().items()},
                        "opt": self.opt.state_dict(), "gen": self.gen.get_state(), "torch_rng": torch.get_rng_state(),
                        "cuda_rng": torch.cuda.get_rng_state_all() if on_cuda else None,
                        "checkpoints": self.checkpoints, "extra": self.hooks.get(), "resumed": self.resumed,
                        "elapsed": elapsed_so_far(self.earlier, self._t_sitting)})

    def finish(self) -> dict[str, Any]:
        """Close the progress bar; returns the card's counters: ``steps``, ``final_train_loss`` and,
        for a resumed run, ``resumed_at_epochs`` and ``train_s_earlier`` (seconds)."""
        self.bar.close()
        return {"steps": self.step, "final_train_loss": self.loss_ema,
                **({"resumed_at_epochs": self.resumed, "train_s_earlier": self.earlier} if self.resumed else {})}
