"""``advtransfer grid --deadline``: a run stops at a cell boundary before its deadline instead of
being killed mid-cell, keeps its finished cells, exits with 75, and the same command without the
deadline ends with the uninterrupted run's table, row for row. Bad deadlines are one line, exit 2,
and nothing written.

The runs are the two-cell grid of tests/test_pack.py (ResNet-20 surrogate, I-FGSM and MI-FGSM at
8/255, two victims, 20 test images) on the session's ci-size models. Time is a fake clock that
advances 10 s per cell run, so the decisions do not depend on this machine's speed: both cells
have the same work (20 images x 10 steps and 2 victims), so after the first the second is
estimated at 10 s too.
"""
from __future__ import annotations

import json
import time

import pytest

from test_reliability import _same_as_reference, _table


@pytest.fixture()
def fake_clock(monkeypatch):
    """The deadline's clock starts at the real time and moves 10 s per cell run (nothing else moves it)."""
    from advtransfer.run import executors
    from advtransfer.run.cellrunner import CellRunner

    now = [time.time()]
    monkeypatch.setattr(executors, "_now", lambda: now[0])
    real_run = CellRunner.run

    def run(self, cell):
        out = real_run(self, cell)
        now[0] += 10.0
        return out

    monkeypatch.setattr(CellRunner, "run", run)
    return now


def test_durations_and_clock_times_parse_and_bad_ones_say_what_to_give():
    from advtransfer.core.errors import UserError
    from advtransfer.run.deadline import parse_deadline

    assert parse_deadline("90m", now=100.0) == 100.0 + 5400
    assert parse_deadline("2h30m", now=0.0) == 9000 and parse_deadline("1.5h", now=0.0) == 5400
    assert parse_deadline("45s", now=0.0) == 45 and parse_deadline("10min", now=0.0) == 600
    assert parse_deadline("2026-12-08T00:40+00:00") == 1796690400.0  # a zone named: that instant
    for bad in ("soon", "", "h", "0m", "-5m"):
        with pytest.raises(UserError, match="--deadline"):
            parse_deadline(bad, now=0.0)


def test_a_run_stops_before_the_cell_that_would_end_after_its_deadline_and_resumes(tiny, fake_clock):
    """Deadline 15 s ahead: the first cell runs (nothing measured yet) and takes 10 s; the second,
    estimated at 10 s, would end at 20 s, after the deadline, so it is not started. A rerun
    without the deadline crafts only that one, and the table is the uninterrupted run's."""
    from advtransfer.grid import load_grid
    from advtransfer.run.context import RunContext
    from advtransfer.run.deadline import DeadlineReached
    from advtransfer.run.runner import run_grid

    run = tiny["tmp"] / "deadline-api"
    lines: list[str] = []
    with pytest.raises(DeadlineReached) as stop:
        run_grid(load_grid(str(tiny["grid"])), RunContext(run, progress=False, deadline=fake_clock[0] + 15),
                 log=lines.append)
    assert (stop.value.finished, stop.value.left) == (1, 1)
    assert stop.value.left_seconds == pytest.approx(10.0)  # the same work as the timed cell
    assert len(list((run / "shards").glob("*.parquet"))) == 1
    assert len(_table(run)) == 2, "the finished cell's two victims are merged into the table"
    assert json.loads((run / "manifest.json").read_text())["finished_at"] is None
    assert "stopped before the deadline" in (run / "run.log").read_text()
    # a deadline far enough ahead: the same command runs the rest and stops nowhere
    lines.clear()
    run_grid(load_grid(str(tiny["grid"])), RunContext(run, progress=False, deadline=fake_clock[0] + 3600),
             log=lines.append)
    assert sum("crafting" in m for m in lines) == 1, "only the cell not started is crafted"
    _same_as_reference(run, tiny["ref"])


def test_the_command_exits_75_at_its_deadline_and_bad_deadlines_write_nothing(tiny, fake_clock, capsys):
    """Through the CLI: --deadline 15s stops after one cell with exit 75 and one line on what to
    do; a deadline that cannot be read, one that has passed, and one given to a parallel executor
    are each one line with exit 2, before any folder is made."""
    from advtransfer.cli import DEADLINE_EXIT, main

    def grid(run, *extra):
        return main(["grid", str(tiny["grid"]), "--out", str(run), "--no-progress", "--no-plot", "--no-report",
                     *extra])

    run = tiny["tmp"] / "deadline-cli"
    assert grid(run, "--deadline", "15s") == DEADLINE_EXIT == 75
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "1 cell(s) run in this sitting, 1 still to run" in err[0]
    assert "later --deadline (or none)" in err[0]
    assert len(list((run / "shards").glob("*.parquet"))) == 1
    assert grid(run) == 0
    _same_as_reference(run, tiny["ref"])
    capsys.readouterr()
    for bad, says in (("soon", "neither a duration"), ("2020-01-01T00:00", "has passed"),
                      ("1h --executor local", "serial executor only")):
        out = tiny["tmp"] / f"deadline-bad-{len(says)}"
        value, *more = bad.split(" ")
        assert grid(out, "--deadline", value, *more) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0] and err[0].startswith("advtransfer: error:"), err
        assert not out.exists(), "bad input writes nothing"
