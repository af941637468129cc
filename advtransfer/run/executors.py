"""Executors: who runs the cells of a grid once its models are trained.

- ``serial``: one after another in this process (the default).
- ``local``: a pool of worker processes on this machine. On CUDA, one worker per visible GPU
  (worker k uses ``cuda:k``); on a CPU, ``workers`` processes that split the cores between them
  (each gets ``threads // workers`` torch threads and passive OpenMP waiting: oversubscribed
  spin-waiting threads run far slower than the same work done in turn).
- ``submitit``: Slurm job arrays through submitit; each array task runs a chunk of cells. The
  cluster parameters come from a small YAML profile (``--profile``), e.g.::

      cluster: slurm            # or local: submitit's local executor (real subprocesses, no Slurm)
      slurm_partition: gpu
      gpus_per_node: 1
      cpus_per_task: 8
      mem_gb: 32
      timeout_min: 240
      slurm_array_parallelism: 16
      cells_per_task: 4         # cells run one after another in one array task (default 1)

Whatever the executor, cells are the same (same ids, same crafting code, :class:`CellRunner`),
each cell writes only its own files (examples, per-image table, shard) through atomic renames,
and the main process merges the shards into the table once at the end, so the folder ends with
the same table as a serial run, each (cell, victim) row once. A cell that fails on a worker
(an exception, or the worker process dying) is reported with its error in ``RUN/run.log`` and
retried once; cells still failing are listed by :class:`CellsFailed` after every other cell ran.
"""
from __future__ import annotations

import contextlib
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..core.config import EXECUTORS  # noqa: F401  (re-exported: the executor names)
from ..core.errors import UserError

if TYPE_CHECKING:
    from .cellrunner import CellRunner
    from .context import RunContext
    from ..grid import GridSpec


class CellsFailed(RuntimeError):
    """Cells that failed twice (first try and retry); the other cells finished and are in the table."""

    def __init__(self, failures: dict[str, str], total: int, run_dir: Path) -> None:
        self.failures, self.total, self.run_dir = failures, total, run_dir
        super().__init__(f"{len(failures)} of {total} cells failed after a retry (details in {run_dir / 'run.log'}): "
                         + "; ".join(f"{c}: {e}" for c, e in failures.items()))


@dataclass(frozen=True)
class Outcome:
    """What running one cell on a worker gave: victims evaluated, or the error (one line)."""

    cell_id: str
    evaluated: int = 0
    error: str | None = None
    seconds: float = 0.0
    worker: str = ""


def _now() -> float:
    """Wall-clock seconds since the epoch (the deadline's clock; tests replace it)."""
    return time.time()


def check_executor_setup(executor: str, profile: str | None) -> None:
    """What running with ``executor`` needs besides the grid's own values (which
    :meth:`advtransfer.grid.GridSpec.validate` checks): submitit's profile file and package; no
    profile for the other executors. One clear line for each problem."""
    if executor == "submitit":
        load_profile(profile)
        try:
            import submitit  # noqa: F401
        except ImportError:
            raise UserError("the submitit executor needs submitit: pip install 'advtransfer[slurm]'") from None
    elif profile:
        raise UserError(f"--profile is read by the submitit executor only, not by {executor!r}; "
                        "add --executor submitit or drop --profile")


def cpu_threads() -> int:
    """The CPU threads this process may use (its torch thread count, which honours OMP_NUM_THREADS)."""
    import torch

    return max(1, torch.get_num_threads())


def plan_workers(device: str, workers: int | None, n_cells: int) -> list[tuple[str, int]]:
    """(device, torch threads) of each local worker. ``cuda`` without an index: one worker per
    visible GPU (unless ``workers`` says fewer); otherwise ``workers`` (default: one per core,
    at most the number of cells) share ``device`` and split the cores."""
    import torch

    cores = cpu_threads()
    if device == "cuda" and torch.cuda.is_available():
        n = min(workers or torch.cuda.device_count(), torch.cuda.device_count(), max(1, n_cells))
        return [(f"cuda:{k}", max(1, cores // n)) for k in range(n)]
    n = max(1, min(workers or cores, max(1, n_cells)))
    return [(device, max(1, cores // n))] * n


def _worker_env(threads: int):
    """Environment inherited by worker processes started inside the block: their OpenMP thread
    count and passive waiting (a user's own OMP_WAIT_POLICY is kept)."""
    from ..core.utils import temp_env

    return temp_env(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads,
                    OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))


def _error_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}".rstrip(": ")


def _run_guarded(runner: "CellRunner", cell_id: str, worker: str) -> Outcome:
    """Run one cell, turning an exception into an :class:`Outcome` with its error (the full
    traceback goes to the run log)."""
    t0 = time.perf_counter()
    try:
        from ..core import faults

        faults.fail("cell", cell_id)
        n = runner.run(runner.cell(cell_id))
        return Outcome(cell_id, n, None, time.perf_counter() - t0, worker)
    except Exception as exc:  # noqa: BLE001 - reported, retried once, then listed
        write = getattr(runner.log, "write", None)
        if write is not None:
            write(f"cell {cell_id} failed on {worker}:\n{traceback.format_exc().rstrip()}")
        return Outcome(cell_id, 0, _error_line(exc), time.perf_counter() - t0, worker)


# --- worker side (a fresh process: spawn, or a submitit job) -------------------------------------
_WORKER: dict[str, Any] = {}


def _make_runner(spec: "GridSpec", ctx: "RunContext", name: str) -> "CellRunner":
    """A worker's cell runner for ``ctx`` (a worker's context: its device and thread count)."""
    import torch

    from .cellrunner import CellRunner, RunLog
    from ..plugins import load_plugins

    load_plugins(spec.plugins)  # the user's attacks and networks, as the main process loaded them
    if ctx.threads:
        torch.set_num_threads(ctx.threads)
    log = RunLog(ctx.run_dir, echo=lambda m: print(f"[{name}] {m}", flush=True))
    return CellRunner(spec, ctx, log)


def _init_local_worker(spec: "GridSpec", ctx: "RunContext", slots) -> None:
    device, threads, k = slots.get()
    _WORKER["name"] = f"worker {k} ({device}, {threads} thread{'s' if threads > 1 else ''})"
    _WORKER["runner"] = _make_runner(spec, ctx.for_worker(device, threads), _WORKER["name"])


def _local_cell(cell_id: str) -> Outcome:
    return _run_guarded(_WORKER["runner"], cell_id, _WORKER["name"])


def run_chunk(spec: "GridSpec", ctx: "RunContext", cell_ids: list[str]) -> list[Outcome]:
    """One submitit array task: its cells one after another (each guarded: one failing cell
    does not stop the others) in ``ctx``, the task's context (its device and thread count)."""
    import socket

    name = f"job {os.environ.get('SLURM_ARRAY_JOB_ID', os.environ.get('SUBMITIT_LOCAL_JOB_ID', ''))}" \
           f"_{os.environ.get('SLURM_ARRAY_TASK_ID', '')} on {socket.gethostname()}"
    runner = _make_runner(spec, ctx, name)
    return [_run_guarded(runner, c, name) for c in cell_ids]


# --- main side ------------------------------------------------------------------------------
def run_cells(runner: "CellRunner", log: Callable[[str], None] = print) -> None:
    """Run every cell of ``runner.cells`` with the grid's executor (``runner.spec.executor``, its
    ``workers``; submitit's profile: ``runner.ctx.profile``); the caller merges the table.

    ``serial`` keeps the context's ``deadline`` (:mod:`advtransfer.run.deadline`: no cell is
    started that would end after it; :class:`~advtransfer.run.deadline.DeadlineReached` then) and
    raises a cell's exception at once (as a single process always did); ``local`` and
    ``submitit`` report a failing cell, retry it once after the others, and raise
    :class:`CellsFailed` for cells that failed twice."""
    from tqdm.auto import tqdm

    cells = runner.cells  # executor and workers: checked by GridSpec.validate (advtransfer.run.validate.preflight)
    executor = runner.spec.executor
    if executor == "serial":
        from ..grid import describe
        from .deadline import DeadlineClock, DeadlineReached, cell_work

        clock = DeadlineClock(runner.ctx.deadline) if runner.ctx.deadline is not None else None
        ran = 0
        bar = tqdm(cells, desc=f"grid {runner.spec.name}", unit="cell", disable=not runner.progress)
        try:
            for i, cell in enumerate(bar):
                bar.set_postfix_str(describe(cell), refresh=False)
                if clock is None:
                    runner.run(cell)
                    continue
                work, start = cell_work(runner, cell), _now()
                if not clock.allows(work, start):
                    left = [w for w in (cell_work(runner, c) for c in cells[i:]) if w > 0]
                    raise DeadlineReached(clock.at, ran, len(left), clock.estimate(sum(left)))
                runner.run(cell)
                clock.record(work, _now() - start)
                ran += work > 0
        finally:
            bar.close()
        return
    from .cellrunner import victims_to_evaluate

    # cells with nothing left to do are not sent anywhere (a rerun of a finished grid costs no job)
    todo = [c.cell_id for c in cells if victims_to_evaluate(runner.store, c, runner.spec.victims, runner.shas)[0]]
    if not todo:
        return
    attempt = {"local": _local_attempt, "submitit": _submitit_attempt}[executor]
    failed: dict[str, str] = {}
    for round_ in (1, 2):
        ids = todo if round_ == 1 else list(failed)
        if not ids:
            break
        if round_ == 2:
            log(f"retrying {len(ids)} failed cell{'s' if len(ids) > 1 else ''} once")
        outcomes = attempt(runner, ids, log)
        failed = {o.cell_id: o.error for o in outcomes if o.error is not None}
        for cid, err in failed.items():
            log(f"cell {cid} failed ({'attempt' if round_ == 1 else 'retry'}): {err}")
    if failed:
        raise CellsFailed(failed, len(todo), runner.run_dir)


def _local_attempt(runner: "CellRunner", ids: list[str], log: Callable[[str], None]) -> list[Outcome]:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    from tqdm.auto import tqdm

    plan = plan_workers(runner.device, runner.spec.workers, len(ids))
    log(f"local executor: {len(plan)} worker processes ({', '.join(f'{d} x{t} threads' for d, t in plan)}) "
        f"for {len(ids)} cells")
    mp_ctx = mp.get_context("spawn")  # fork would copy this process's torch threads and CUDA state
    slots = mp_ctx.Queue()
    for k, (d, t) in enumerate(plan):
        slots.put((d, t, k))
    outcomes: list[Outcome] = []
    with _worker_env(plan[0][1]):
        pool = ProcessPoolExecutor(len(plan), mp_context=mp_ctx, initializer=_init_local_worker,
                                   initargs=(runner.spec, runner.ctx, slots))
        try:
            futures = {pool.submit(_local_cell, cid): cid for cid in ids}
            with tqdm(total=len(ids), desc=f"grid {runner.spec.name}", unit="cell", disable=not runner.progress) as bar:
                for fut in as_completed(futures):
                    try:
                        outcomes.append(fut.result())
                    except BrokenProcessPool as exc:  # a worker died (killed, out of memory): its cells failed
                        outcomes.append(Outcome(futures[fut], error=f"worker process died ({_error_line(exc)})"))
                    except Exception as exc:  # noqa: BLE001 - the initializer failed in the worker
                        outcomes.append(Outcome(futures[fut], error=_error_line(exc)))
                    bar.update(1)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            for p in list(getattr(pool, "_processes", {}).values()):  # do not leave workers crafting
                p.terminate()
            raise
        pool.shutdown(wait=True)
    return outcomes


# --- submitit -------------------------------------------------------------------------------------
#: profile keys this module reads itself; every other key goes to submitit's update_parameters
PROFILE_KEYS = {"cluster", "folder", "cells_per_task", "tasks", "threads"}


def load_profile(path: str | None) -> dict:
    """The submitit profile (YAML mapping); without one, submitit picks the cluster itself
    (Slurm when ``sbatch`` is on the PATH)."""
    import yaml

    if not path:
        return {}
    p = Path(path)
    if not p.is_file():
        raise UserError(f"submitit profile {path} does not exist; give a YAML file like 'cluster: slurm'")
    try:
        prof = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"submitit profile {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(prof, dict):
        raise UserError(f"submitit profile {path} must be a mapping like 'cluster: slurm'")
    for key in ("cells_per_task", "tasks", "threads"):
        v = prof.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise UserError(f"submitit profile {path}: {key} must be a whole number >= 1, got {v!r}")
    if prof.get("cluster") not in (None, "slurm", "local", "debug"):
        raise UserError(f"submitit profile {path}: cluster must be slurm, local or debug, got {prof['cluster']!r}")
    return prof


def chunks(ids: list[str], cells_per_task: int | None, tasks: int | None) -> list[list[str]]:
    """Split cell ids into array tasks: ``tasks`` near-equal chunks (round robin), or chunks of
    ``cells_per_task`` (default: one cell a task)."""
    if tasks:
        n = min(tasks, len(ids))
        return [ids[k::n] for k in range(n)]
    size = cells_per_task or 1
    return [ids[k:k + size] for k in range(0, len(ids), size)]


def _submitit_attempt(runner: "CellRunner", ids: list[str], log: Callable[[str], None]) -> list[Outcome]:
    try:
        import submitit
    except ImportError:
        raise UserError("the submitit executor needs submitit: pip install 'advtransfer[slurm]'") from None
    profile, workers = runner.ctx.profile, runner.spec.workers
    prof = load_profile(profile)
    cluster = prof.get("cluster")
    folder = Path(prof.get("folder") or runner.run_dir / "submitit")
    # local cluster: array tasks run at once on this machine, so split its cores (like `local`)
    tasks = prof.get("tasks")
    if cluster in ("local", "debug") and not tasks and not prof.get("cells_per_task"):
        tasks = workers or cpu_threads()
    parts = chunks(ids, prof.get("cells_per_task"), tasks)
    threads = prof.get("threads") or prof.get("cpus_per_task") or (
        max(1, cpu_threads() // len(parts)) if cluster in ("local", "debug") else cpu_threads())
    ex = submitit.AutoExecutor(folder=folder, cluster=cluster)
    params = {k: v for k, v in prof.items() if k not in PROFILE_KEYS}
    params.setdefault("name", f"advtransfer-{runner.spec.name}")
    try:
        ex.update_parameters(**params)
    except (ValueError, TypeError) as exc:
        raise UserError(f"submitit profile {profile}: {str(exc).splitlines()[0]}") from None
    log(f"submitit executor ({ex.cluster}): {len(parts)} array tasks for {len(ids)} cells, "
        f"{threads} thread{'s' if threads > 1 else ''} each; job files in {folder}")
    with _worker_env(threads):  # the local cluster's subprocesses inherit this environment
        task = runner.ctx.for_worker(runner.device, threads)
        jobs = ex.map_array(run_chunk, *zip(*[(runner.spec, task, p) for p in parts]))
    outcomes: list[Outcome] = []
    try:
        for job, part in zip(jobs, parts):
            try:
                outcomes.extend(job.result())
            except Exception as exc:  # noqa: BLE001 - the job failed as a whole (killed, timed out, ...)
                err = f"job {job.job_id} failed ({_error_line(exc)})"
                outcomes.extend(Outcome(c, error=err) for c in part)
    except BaseException:
        for job in jobs:
            with contextlib.suppress(Exception):
                job.cancel(check=False)
        raise
    return outcomes
