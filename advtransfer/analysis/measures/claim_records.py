"""The claims' per-image records, kept with the project so that the claims table can be recomputed
on any clone.

A claims run (``RUNS/<size>/<grid name>/``, written by ``advtransfer grid``) holds adversarial
examples and per-image tables of every cell: hundreds of megabytes, under the git-ignored
``results/``, and hours of compute on 2 cores. The claims table needs far less: for each cell that
a claim pairs, and each victim, which images the victim classified correctly and which the attack
fooled. :func:`export_records` copies exactly that from finished runs into a records folder
(``RECORDS/<size>/<grid name>[@<regime>]/``, committed: ``claims/records/``) laid out as a run folder, so
:func:`~advtransfer.analysis.measures.claims.claims_table` reads it unchanged:

- ``results.parquet``: the run's rows (one per cell and victim) of the cells some claim pairs;
- ``samples/<cell_id>.parquet``: per image ``cell_id``, ``victim``, ``index`` (position in the
  test set), ``clean_correct``, ``success`` and, where the run recorded it, ``hit`` (the goal met
  on x_adv whatever the victim said on x: the all-images denominator), nothing else;
- ``source.json``: where they came from (the run's git sha, versions, dates, and for each model its
  weights' sha256, clean accuracy and provenance).

Only a run whose last ``advtransfer grid`` finished every cell is exported (``finished_at`` in its
manifest); an unfinished or absent run leaves the records of its size and grid as they were.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from ...core.errors import UserError
from ...core.resources import portable_path
from ...core.utils import atomic_path, atomic_write_text
from ..runs import read_results
from .claims import STANDARD, ClaimsSpec, claim_rows, grid_name, whitebox_cells
from .compare import Samples

#: the columns a record keeps per image (``cell_id`` is constant in a file: parquet stores it once)
RECORD_COLUMNS = ("cell_id", "victim", "index", "clean_correct", "success")
#: kept too where the run has it (runs from before it was recorded do not)
OPTIONAL_COLUMNS = ("hit",)


@dataclass(frozen=True)
class Exported:
    """One exported (size, grid): cells and rows kept, and the records' size on disk in bytes."""

    size: str
    grid: str
    cells: int
    rows: int
    bytes: int


def run_finished(run: Path) -> str | None:
    """None when ``run``'s last grid run finished every cell, else why not (one phrase)."""
    path = run / "manifest.json"
    if not (run / "results.parquet").is_file() or not path.is_file():
        return "no results.parquet or manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return "its manifest.json is unreadable"
    if not manifest.get("finished_at"):
        return "its last `advtransfer grid` did not finish (rerun it: finished cells are kept)"
    return None


def claim_cells(spec: ClaimsSpec, size: str, grid: str, df: pd.DataFrame, regime: str = STANDARD) -> set[str]:
    """Cell ids of the rows that some claim on ``grid`` in ``regime`` at zoo ``size`` pairs (either
    side) in one run's results."""
    cells: set[str] = set()
    for c in spec.measured(size):
        if (grid, regime) not in c.grid_runs() or c.skip:
            continue
        if c.by == "whitebox":
            if (grid, regime) == c.grid_runs()[0]:
                cells |= whitebox_cells(df, c, ladder=False)
            if (grid, regime) == c.grid_runs()[-1] and c.ladder:
                cells |= whitebox_cells(df, c, ladder=True)
            continue
        a, b, _ = claim_rows(df, c)
        cells |= set(a["cell_id"]) | set(b["cell_id"])
    return cells


def _source(manifest: dict, run: Path) -> dict:
    keep = ("arch", "sha256", "clean_acc", "train_s", "provenance", "recipe_hash", "method_version")
    return {
        "run": portable_path(run), "grid_file": portable_path(manifest.get("grid_file")),
        "git_sha": manifest.get("git_sha"),
        "created_at": manifest.get("created_at"), "finished_at": manifest.get("finished_at"),
        "versions": manifest.get("versions"), "device": manifest.get("device"),
        "zoo": {m: {k: c.get(k) for k in keep if k in c} for m, c in sorted((manifest.get("zoo") or {}).items())},
    }


def export_run(spec: ClaimsSpec, size: str, grid: str, run: Path, dest: Path,
               regime: str = STANDARD) -> tuple[int, int, int]:
    """Write the records of one finished run (``grid`` in ``regime``) into the empty folder
    ``dest``. Returns (cells, rows, bytes on disk)."""
    manifest = json.loads((run / "manifest.json").read_text())
    df = read_results(run)
    finished = manifest.get("finished_cells")
    if finished is not None:  # rows of cells this grid no longer has (an older run into the folder)
        df = df[df["cell_id"].isin(set(finished))]
    cells = claim_cells(spec, size, grid, df, regime)
    rows = df[df["cell_id"].isin(cells)].reset_index(drop=True)
    samples = Samples(run)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "samples").mkdir(exist_ok=True)
    for cid in sorted(cells):
        s = samples.get_all(cid)
        s = s[s["victim"].isin(set(rows.loc[rows["cell_id"] == cid, "victim"]))]
        cols = list(RECORD_COLUMNS) + [c for c in OPTIONAL_COLUMNS if c in s.columns]
        s = s[cols].sort_values(["victim", "index"], kind="stable").reset_index(drop=True)
        s = s.astype({"index": "int32", "clean_correct": bool, "success": bool, **{c: bool for c in cols[5:]}})
        with atomic_path(dest / "samples" / f"{cid}.parquet") as tmp:
            s.to_parquet(tmp, index=False, compression="zstd")
    with atomic_path(dest / "results.parquet") as tmp:
        rows.to_parquet(tmp, index=False, compression="zstd")
    atomic_write_text(dest / "source.json", json.dumps(_source(manifest, run), indent=1, default=str) + "\n")
    nbytes = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    return len(cells), len(rows), nbytes


def export_records(spec: ClaimsSpec, runs: str | Path, records: str | Path,
                   log: Callable[[str], None] = print) -> list[Exported]:
    """For every size of ``spec`` and run its claims read, export ``runs/<size>/<run>/`` into
    ``records/<size>/<run>/`` when that run finished (``<run>``: the grid's name, and
    ``<grid name>@<regime>`` in a claim's other regimes); say in one line what was skipped and why."""
    runs, records = Path(runs), Path(records)
    if runs.resolve() == records.resolve():
        raise UserError(f"--records {records} is the runs folder itself; pass a separate folder (claims/records)")
    done: list[Exported] = []
    for size in spec.sizes:
        for grid, regime in spec.runs(size):
            name = grid_name(grid) + ("" if regime == STANDARD else f"@{regime}")
            run = runs / size / name
            if not run.exists():
                continue
            why = run_finished(run)
            if why is not None:
                log(f"advtransfer claims: {run} not exported ({why}); records kept as they were")
                continue
            staging = records / size / f".{name}.new"
            shutil.rmtree(staging, ignore_errors=True)
            dest = records / size / name
            cells, nrows, nbytes = export_run(spec, size, grid, run, staging, regime)
            if dest.exists():  # a kill here leaves only the staging folder: the next export redoes it
                shutil.rmtree(dest)
            staging.rename(dest)
            done.append(Exported(size, name, cells, nrows, nbytes))
    return done


__all__ = ["OPTIONAL_COLUMNS", "RECORD_COLUMNS", "Exported", "claim_cells", "export_records", "export_run", "run_finished"]
