"""Runs a grid: trains missing zoo models, crafts each cell once (cached), evaluates victims,
writes shards and the merged table (the cells themselves: :mod:`advtransfer.run.cellrunner`, run by
an executor: :mod:`advtransfer.run.executors`). Rerunning skips finished cells; a victim added to the grid
is evaluated on the cached examples without re-crafting."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import pandas as pd

from ..core import faults
from .cellrunner import CellRunner, RunLog
from .context import RunContext
from .deadline import DeadlineReached
from ..core.errors import UserError
from ..grid import GridSpec, expand_cells
from ..models import zoo
from ..core.resources import results_dir
from .store import RunStore
from ..core.utils import eps_to_str, git_sha, checksum_matches, versions


def default_run_dir(spec: GridSpec) -> Path:
    return results_dir() / spec.name


def run_dir_for(spec: GridSpec, out: str | Path | None = None) -> Path:
    """The run folder of ``spec``: ``out`` if given, else :func:`default_run_dir`."""
    return Path(out) if out else default_run_dir(spec)


def context_for(spec: GridSpec, context: RunContext | str | Path | None = None) -> RunContext:
    """The run context ``context`` names: itself when it is one; a run folder (None:
    :func:`default_run_dir`) stands for a context in that folder with the defaults (the model cache
    of ``$ADVTRANSFER_CACHE``, the data of ``$ADVTRANSFER_DATA``, cpu, progress bars)."""
    return context if isinstance(context, RunContext) else RunContext(run_dir_for(spec, context))


def run_grid(spec: GridSpec, context: RunContext | str | Path | None = None, log: Callable[[str], None] = print,
             executor: str | None = None, workers: int | None = None) -> Path:
    """Run every cell of ``spec`` in ``context`` (a :class:`~advtransfer.run.context.RunContext`,
    or just the run folder: :func:`context_for`); returns the run folder. See the module docstring.

    First the preflight (:func:`advtransfer.run.validate.preflight`: every value of the spec, the
    device, the run folder, the data, every cell's attack, the checkpoints), so bad input is one
    UserError before anything is trained or written. The run folder is locked for the run
    (:class:`advtransfer.core.lock.RunLock`: a second run on it stops at once naming the holder) and
    what the run prints goes to ``RUN/run.log`` too. A run that fails on bad input before writing
    a result removes the folder it created.

    ``executor`` (default: the spec's) runs the cells (:mod:`advtransfer.run.executors`): ``serial``
    in this process, ``local`` in ``workers`` processes on this machine, ``submitit`` as Slurm job
    arrays (the context's ``profile``: a YAML file of cluster parameters). Every executor writes the
    same table."""
    from .validate import preflight

    spec = spec.with_overrides(executor=executor, workers=workers)
    ctx = context_for(spec, context)
    preflight(spec, ctx)
    _run_with_lock(spec, ctx, log)
    return ctx.run_dir


#: what a run writes before its first result: a failed run that wrote only these leaves no folder
_BOOKKEEPING = {"run.lock", "lock.json", "run.log"}


def _remove_if_only_bookkeeping(run_dir: Path) -> None:
    """Delete a run folder this run created if it holds nothing but the lock and the log (bad
    input found while loading models, say): bad input leaves nothing behind."""
    import shutil

    if run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= _BOOKKEEPING:
        shutil.rmtree(run_dir, ignore_errors=True)


def _run_with_lock(spec: GridSpec, ctx: RunContext, log: Callable[[str], None]) -> None:
    from ..core.lock import RunLock

    new_folder = not ctx.run_dir.exists()
    with RunLock(ctx.run_dir):  # raises at once (nothing touched) when another process holds the folder
        try:
            _run_logged(spec, ctx, log)
        except UserError:
            if new_folder:  # ours alone (we hold the lock): leave no folder behind for bad input
                _remove_if_only_bookkeeping(ctx.run_dir)
            raise


def _run_logged(spec: GridSpec, ctx: RunContext, log: Callable[[str], None]) -> None:
    runlog = RunLog(ctx.run_dir, log)
    runlog.write(f"run started: grid {spec.name} ({spec.source}), {len(spec.surrogates)} surrogate rows, "
                 f"{len(spec.victims)} victims, n={spec.n}, size {spec.size}, device {ctx.device}, git {git_sha()}")
    try:
        _run_locked(spec, ctx, runlog)
    except KeyboardInterrupt:
        runlog.write("run interrupted: finished cells are saved; rerun the same command to resume")
        raise
    except DeadlineReached as exc:
        runlog.write(f"run {exc}; finished cells are saved; rerun with a later deadline (or none) to go on")
        raise
    except BaseException as exc:
        runlog.write(f"run failed: {type(exc).__name__}: {exc}")
        raise
    runlog.write("run finished")


def _run_locked(spec: GridSpec, ctx: RunContext, log: Callable[[str], None]) -> None:
    from .executors import run_cells
    from ..plugins import plugin_records

    store = RunStore(ctx.run_dir, log.warn if isinstance(log, RunLog) else log)
    store.remove_stale_temporaries()  # what a killed run was writing; complete files are never touched
    zoo.ensure_trained(spec.model_names(), spec.size, ctx.cache, ctx.data_dir, ctx.device, ctx.progress, log)
    faults.point("trained")
    runner = CellRunner(spec, ctx, log)
    for m in spec.model_names():  # verify every checkpoint before anything is written
        runner.models.get(m)
    manifest = store.read_manifest()
    manifest.update({
        # spec: the values the run used (CLI flags applied), what the analyses read
        # (RunSpec.from_manifest); grid: the file as written, for provenance
        "run_id": runner.run_id, "spec": spec.run_spec().to_dict(), "grid": spec.raw, "grid_file": spec.source,
        "reference": spec.reference,
        "plugins": plugin_records(spec.plugins),
        "git_sha": runner.sha,
        "versions": versions(), "device": ctx.device, "updated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "zoo": {m: {k: c.get(k) for k in ("arch", "family", "kind", "recipe_hash", "sha256", "clean_acc", "train_s",
                                          "provenance", "versions", "method_version")}
                | {k: c[k] for k in ("data", "init_from") if c.get(k) is not None}  # training-data variant, parent
                for m, c in runner.cards.items()},
        "cells": {**manifest.get("cells", {}), **{c.cell_id: c.config for c in runner.cells}},
    })
    manifest.setdefault("created_at", manifest["updated_at"])
    manifest["finished_at"] = None  # set below only when every cell of this grid has its rows
    store.write_manifest(manifest)
    try:
        run_cells(runner, log)
    finally:
        store.merge()  # once per run (and on interruption): finished cells are in the table
    manifest["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    manifest["finished_cells"] = sorted(c.cell_id for c in runner.cells)
    store.write_manifest(manifest)


def _peek_table(path: Path) -> pd.DataFrame | None:
    """A checked table read without side effects (a corrupt one is reported by the real run)."""
    if not path.is_file() or checksum_matches(path) is False:
        return None
    try:
        return pd.read_parquet(path)
    except Exception:
        return None


def plan_grid(spec: GridSpec, context: RunContext | str | Path | None = None) -> dict:
    """What :func:`run_grid` would do, reading only: the models it would train, and per cell
    whether its examples are cached, which victims it would evaluate, and its cost in passes
    (surrogate forward+backward passes to craft, victim forward passes to evaluate). Runs the
    same preflight as :func:`run_grid` first. Writes nothing.

    Cells whose surrogates are not trained yet get their id only after training (``cell_id``
    None: the id hashes the weights)."""
    from ..models.sources import is_trained
    from .validate import preflight

    ctx = context_for(spec, context)
    run_dir = ctx.run_dir
    preflight(spec, ctx)
    specs = zoo.load_specs()
    train = [m for m in spec.model_names() if not is_trained(zoo.get_spec(m, specs), spec.size, ctx.cache)]
    shas = {m: (zoo.read_card(m, spec.size, ctx.cache) or {}).get("sha256") or f"untrained:{m}"
            for m in spec.model_names()}
    store = RunStore(run_dir, log=lambda _m: None)
    rows = []
    for cell in expand_cells(spec, shas):
        pending = any(m in train for m in cell.surrogate.models)
        attack = cell.resolved
        cached = not pending and store.adv_path(cell.cell_id).is_file() and checksum_matches(store.adv_path(cell.cell_id)) is not False
        packed = not pending and not cached and store.is_packed(cell.cell_id)
        if pending or not run_dir.is_dir():
            todo = list(spec.victims)
        else:
            shard = _peek_table(store.shard_path(cell.cell_id))
            done = set() if shard is None else {v for v, s in zip(shard["victim"], shard["victim_sha"]) if shas.get(v) == s}
            todo = [v for v in spec.victims if v not in done]
            if packed and (todo or shard is None):  # a packed cell that needs a victim is crafted again, every row with it
                packed, todo = False, list(spec.victims)
        n_models = len(cell.surrogate.models)
        rows.append({"cell_id": None if pending else cell.cell_id, "surrogate": cell.surrogate.name,
                     "attack": cell.attack.label, "eps": eps_to_str(cell.eps), "seed": cell.seed,
                     "examples": "cached" if cached else "packed" if packed else "to craft", "victims_to_evaluate": len(todo),
                     "craft_passes": 0 if cached or packed else attack.craft_passes(n_models, spec.n),
                     "eval_passes": len(todo) * spec.n})
    return {"run_dir": run_dir, "train": train, "cells": rows}
