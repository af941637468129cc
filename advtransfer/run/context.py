"""The run context: where a grid run reads and writes and what it runs on, as one frozen value.

A run used to hand its model cache, data folder, device, progress flag and submitit profile from
function to function (the runner, the executors, the cell runner and the preflight each took
them one by one). :class:`RunContext` holds them instead: the ``grid`` command makes it once from
its flags (a Python caller: ``run_grid(spec, RunContext(out, cache=..., progress=False))``, or just
the run folder for the defaults), and everything below takes it as one argument. It pickles, so the local executor's worker processes and submitit's
array tasks get the same value; a worker gets a copy naming its own device and thread count
(:meth:`RunContext.for_worker`).

What the run computes stays in the :class:`advtransfer.grid.GridSpec`, the one source of those
values (checked by ``GridSpec.validate`` and recorded in the manifest): the precision (it enters
the cell id), the compile mode, the executor and its workers. The context holds only what may
change between two runs of one spec without changing a result row's numbers.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class RunContext:
    """Where and on what one grid run runs; made once per run and passed down as a value.

    ``run_dir``: the run folder (a Path; a str is converted). ``cache``: the model cache folder
    (None: ``$ADVTRANSFER_CACHE``, else the user's cache). ``data_dir``: the dataset folder (None:
    ``$ADVTRANSFER_DATA``, else a download). ``device``: the torch device the cells run on.
    ``threads``: torch CPU threads of the process running cells (None: the process keeps its own
    count; workers get theirs from the executor). ``progress``: draw progress bars. ``profile``:
    the submitit executor's YAML file of cluster parameters (None for the other executors).
    ``deadline``: seconds since the epoch after which no cell should still be running (None: no
    limit; the serial executor keeps it, :mod:`advtransfer.run.deadline`)."""

    run_dir: Path
    cache: str | os.PathLike | None = None
    data_dir: str | os.PathLike | None = None
    device: str = "cpu"
    threads: int | None = None
    progress: bool = True
    profile: str | None = None
    deadline: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "run_dir", Path(self.run_dir))

    def for_worker(self, device: str, threads: int) -> "RunContext":
        """This context for a worker process of a parallel executor: its own device and torch
        thread count, no progress bars (the main process draws one for the whole grid)."""
        return replace(self, device=device, threads=threads, progress=False)
