"""Resumable training: the SGD loop's state at the end of each epoch, so that a training run cut
off (a session's end, a kill, a reboot) continues where it stopped rather than from the start.

A converged surrogate can take hours on 2 cores, more than one sitting (the measured costs are in
claims/README.md and the models' cards).
:func:`advtransfer.training.standard.fit` writes, after every epoch, one file holding everything the
rest of the run depends on: the network's and the optimiser's state, the data-order and augmentation
generator, torch's global generator, the step and epoch counters, the kept checkpoints, and the
method's own state (cSGLD's samples and noise generator, via :class:`ResumeHooks`). Restarting the
same entry loads it and runs the remaining epochs, so the weights are bit-identical to an
uninterrupted run on the same machine and thread count (tested), and the card's
``meta.resumed_at_epochs`` says that it was resumed and where.

The file lives in the cache beside the weights (``zoo/<size>/.resume/<name>-<recipe hash>.pt``),
never in the shipped zoo: a half-trained model is never a model. It is read with
``torch.load(weights_only=True)``; one from another recipe, or unreadable, is set aside with a
line on stderr and the run starts from the beginning. The zoo deletes it once the card is written.
The fast method (airbench's loop, :mod:`advtransfer.training.fast`) saves the same file from its
own loop, with its lookahead average. The other methods (LGV and SWAG, whose hooks keep
collections elsewhere; TRADES, SHOT, the ensemble defences) do not pass hooks and train in one
go, as before.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..core.utils import atomic_path

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
