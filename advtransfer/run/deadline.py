"""A run's deadline: stop at a cell boundary before a time limit instead of being killed mid-cell.

A batch job (a Slurm allocation, a machine lent for a session) ends at a known time; a cell killed
then loses all its crafting. With a deadline (``advtransfer grid --deadline``, or
``RunContext(deadline=...)``) the serial executor starts no cell that, at the speed this run has
measured on the cells it finished, would end after the deadline. The cell running when the
deadline passes always finishes; the first cell with work is started whenever the deadline has
not passed (nothing is measured yet). Models the grid still has to train are trained first,
whatever the deadline: a training is never cut. A run that stops early raises
:class:`DeadlineReached` after merging its finished cells into the table; the same command with a
later deadline (or none) goes on from there, and ``advtransfer pack`` can carry the folder to
another machine first.

A cell's work is counted in surrogate forward+backward image-passes (its crafting, 0 when its
examples are cached) plus a third of a pass per victim forward pass; the run's seconds per unit
are its finished cells' wall time over their units. The estimate is as good as the cells are
alike: a cell of another attack or surrogate may run faster or slower per pass than those timed.
"""
from __future__ import annotations

import re
import time
from datetime import datetime
from typing import TYPE_CHECKING

from ..core.errors import UserError

if TYPE_CHECKING:
    from .cellrunner import CellRunner
    from ..grid import Cell

#: a victim forward pass, in surrogate forward+backward passes (a backward costs about two forwards)
EVAL_PASS = 1 / 3

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?:in)?)?(?:(\d+(?:\.\d+)?)s)?$")


def parse_deadline(text: str, now: float | None = None) -> float:
    """The deadline ``text`` names, in seconds since the epoch: a duration from ``now`` (hours,
    minutes and seconds written ``<h>h<m>m<s>s``, each part optional and decimals allowed, ``min``
    for ``m``) or a clock time in ISO 8601 (``2026-12-08T00:40``, local time unless it names a
    zone: ``2026-12-08T00:40+00:00``). One-line :class:`UserError` otherwise."""
    now = time.time() if now is None else now
    s = str(text).strip().lower().replace(" ", "")
    m = _DURATION.match(s)
    if s and m and any(m.groups()):
        h, mi, sec = (float(g) if g else 0.0 for g in m.groups())
        seconds = 3600 * h + 60 * mi + sec
        if seconds <= 0:
            raise UserError(f"--deadline {text!r} is no time from now; give a positive duration such as 90m")
        return now + seconds
    try:
        return datetime.fromisoformat(str(text).strip()).timestamp()
    except ValueError:
        raise UserError(f"--deadline {text!r} is neither a duration (90m, 2h30m, 45s) nor a clock time "
                        "(ISO 8601: 2026-12-08T00:40); give one of those") from None


def describe_deadline(at: float) -> str:
    """``at`` (seconds since the epoch) as a local clock time, to the minute."""
    return datetime.fromtimestamp(at).astimezone().strftime("%Y-%m-%d %H:%M %Z").strip()


def check_deadline(at: float | None, executor: str, now: float | None = None) -> None:
    """A deadline must lie ahead and be kept by the serial executor (the parallel ones hand their
    cells out at once); one line each, before anything runs."""
    if at is None:
        return
    now = time.time() if now is None else now
    if at <= now:
        raise UserError(f"the deadline {describe_deadline(at)} has passed; give a later one or drop --deadline")
    if executor != "serial":
        raise UserError(f"--deadline is kept by the serial executor only, not by {executor!r}, which hands "
                        "its cells out at once; use --executor serial or the scheduler's own time limit")


def cell_work(runner: "CellRunner", cell: "Cell") -> float:
    """The work ``cell`` has left in ``runner``'s folder, in surrogate forward+backward passes
    (its crafting unless its examples are cached, plus :data:`EVAL_PASS` per victim image pass);
    0 when it has none."""
    from .cellrunner import victims_to_evaluate

    todo, _ = victims_to_evaluate(runner.store, cell, runner.spec.victims, runner.shas)
    if not todo:
        return 0.0
    n = len(runner.x)
    craft = 0 if runner.store.adv_intact(cell.cell_id) else cell.resolved.craft_passes(len(cell.surrogate.models), n)
    return float(craft) + EVAL_PASS * len(todo) * n


class DeadlineReached(RuntimeError):
    """The run stopped before its deadline at a cell boundary: ``finished`` cells ran in this
    sitting, ``left`` cells still have work, about ``left_seconds`` of it at this sitting's speed
    (None when no cell was timed). The finished cells are in the table."""

    def __init__(self, at: float, finished: int, left: int, left_seconds: float | None) -> None:
        self.at, self.finished, self.left, self.left_seconds = at, finished, left, left_seconds
        est = "" if left_seconds is None else f", about {_hours(left_seconds)} at this sitting's speed"
        super().__init__(f"stopped before the deadline {describe_deadline(at)}: {finished} cell(s) run in this "
                         f"sitting, {left} still to run{est}")


def _hours(seconds: float) -> str:
    m = int(round(seconds / 60))
    return f"{m // 60} h {m % 60:02d} min" if m >= 60 else f"{max(m, 1)} min"


class DeadlineClock:
    """Decides, cell by cell, whether the next one fits before ``at`` (seconds since the epoch)."""

    def __init__(self, at: float) -> None:
        self.at = at
        self.seconds = 0.0  # wall time of the timed cells
        self.work = 0.0  # their work units

    def estimate(self, work: float) -> float | None:
        """Seconds ``work`` units take at the speed measured so far (None before any cell)."""
        return work * self.seconds / self.work if self.work > 0 else None

    def allows(self, work: float, now: float) -> bool:
        """Whether a cell of ``work`` units started at ``now`` ends by the deadline (a cell with
        no work always runs; before any cell is timed, any cell starts while the deadline is ahead)."""
        if work <= 0:
            return True
        if now >= self.at:
            return False
        est = self.estimate(work)
        return est is None or now + est <= self.at

    def record(self, work: float, seconds: float) -> None:
        if work > 0:
            self.work += work
            self.seconds += max(seconds, 0.0)
