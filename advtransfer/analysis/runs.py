"""Reading a finished run folder for the analyses (results.parquet, samples/, manifest.json) and
writing the small CSV tables of the commands. No models, no statistics: the measures, the report
and the commands share these so each run file is read, and each damage reported, one way."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pandas as pd

from ..core.errors import UserError

# columns a run from before matched baselines and replicates lacks (read_results fills them in)
BASELINE_COLUMNS = ("baseline_for", "match", "replicate", "surrogate_base")


def read_results(run_dir: str | Path) -> pd.DataFrame:
    """``RUN/results.parquet`` with the analysis defaults for columns older runs lack
    (``replicate`` 0, ``surrogate_base`` = ``surrogate``, ``match`` 'none', ``baseline_for`` '')."""
    from ..run.store import RunStore

    run = Path(run_dir)
    if not run.is_dir():
        raise UserError(f"run folder {str(run_dir)!r} does not exist; pass the folder `advtransfer grid` wrote")
    df = RunStore(run).read_results()
    df.attrs["missing"] = [c for c in BASELINE_COLUMNS if c not in df.columns]
    if "replicate" not in df.columns:
        df["replicate"] = 0
    if "surrogate_base" not in df.columns:
        df["surrogate_base"] = df["surrogate"]
    if "match" not in df.columns:
        df["match"] = "none"
    if "baseline_for" not in df.columns:
        df["baseline_for"] = ""
    df["baseline_for"] = df["baseline_for"].fillna("").astype(str)
    df["match"] = df["match"].fillna("none").astype(str)
    df["replicate"] = df["replicate"].fillna(0).astype(int)
    return df


def run_context(run_dir: str | Path) -> tuple[pd.DataFrame, dict]:
    """(results table, manifest) of a run folder; UserError if it is not one or a file is damaged."""
    from ..run.store import RunStore

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run folder {str(run_dir)!r} does not exist")
    store = RunStore(run_dir)
    return store.read_results(), store.read_manifest()


def read_samples(run_dir: str | Path) -> pd.DataFrame:
    """All per-image tables of a run concatenated, each checked against its checksum (empty
    frame when there are none)."""
    from ..run.store import RunStore

    return RunStore(run_dir).all_samples()


def joined_samples(run_dir: str | Path) -> pd.DataFrame:
    """Per-image rows (one per cell, victim and image) joined with the cell fields of the results
    table: surrogate, attack_label, eps (a fraction of the pixel range), eps_str, targeted, is_whitebox."""
    res, _ = run_context(run_dir)
    s = read_samples(run_dir)
    if not len(s):
        raise UserError(f"{run_dir} has no samples/*.parquet; rerun the grid with this version")
    keep = ["cell_id", "victim", "surrogate", "attack_label", "eps", "eps_str", "targeted", "is_whitebox"]
    return s.merge(res[keep], on=["cell_id", "victim"], how="inner")


def read_table(path: str | Path, writer: str) -> pd.DataFrame | None:
    """A parquet table a measure wrote into the run folder, or None when absent; a damaged file is
    one :class:`UserError` naming it and ``writer``, the command that writes it again."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise UserError(f"{path} is unreadable ({type(exc).__name__}: damaged or truncated); delete it and run "
                        f"`{writer}` to write it again") from None


def check_out_dir(value: str | Path | None, flag: str = "--out") -> None:
    """One :class:`UserError` when ``value`` (an output folder a command will create or fill) names
    an existing file, or a path under one; None (the command's default folder) passes."""
    if value is None:
        return
    path = Path(value)
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                what = "is a file, not a folder" if p == path else f"lies under the file {str(p)!r}"
                raise UserError(f"{flag} {str(value)!r} {what}; name a folder for the output")
            return


def write_tables(tables: dict[str, pd.DataFrame], out: str | Path) -> list[Path]:
    """Each table as ``<out>/<name>.csv`` (written atomically); returns the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, df in tables.items():
        path = out / f"{name}.csv"
        tmp = path.with_suffix(".csv.tmp")
        df.to_csv(tmp, index=False)
        os.replace(tmp, path)
        paths.append(path)
    return paths


def format_pct(df: pd.DataFrame, cols: list[str], fmt: Callable[[float], str] = lambda v: f"{100 * v:.1f}") -> pd.DataFrame:
    """A copy with the rate columns ``cols`` (fractions in [0, 1]) as percentages, for printing."""
    df = df.copy()
    for c in cols:
        if c in df.columns:
            df[c] = df[c].map(lambda v: "" if pd.isna(v) else fmt(v))
    return df


#: folder under a run folder where registered measures (analysis/measures/registry.py) write their tables
MEASURES_DIR = "measures"


def measured(run_dir: str | Path) -> list[tuple[dict, Path]]:
    """(record, parquet path) of every measure table in ``RUN/measures/``, sorted by name."""
    import json

    out = Path(run_dir) / MEASURES_DIR
    found = []
    for js in sorted(out.glob("*.json")) if out.is_dir() else []:
        pq = js.with_suffix(".parquet")
        if pq.is_file():
            try:
                rec = json.loads(js.read_text())
            except ValueError:
                raise UserError(f"{js} is damaged; run `advtransfer measure {run_dir} {js.stem}` again") from None
            found.append((rec, pq))
    return found
