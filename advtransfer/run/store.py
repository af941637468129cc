"""Files of a run folder: cached adversarial examples, per-cell shards, merged tables, manifest.

RUN_DIR/
  adv/<cell_id>.safetensors      x_adv float32 N×C×H×W, index int64 N (+ target, delta)
  adv/<cell_id>.packed           instead of the examples in a packed run (``advtransfer pack``): the cell's
                                 rows and per-image table are final and its examples were left behind
  shards/<cell_id>.parquet       the cell's rows, one per victim (rewritten atomically)
  samples/<cell_id>.parquet      per-image results (victim, index, success, l2)
  results.parquet, results.csv   all shards merged
  manifest.json                  resolved spec (grid.RunSpec), raw grid file, versions, git sha, zoo cards
  run.lock, lock.json            held by the run writing the folder (see advtransfer.core.lock)
  run.log                        what each run printed, with timestamps
Every write goes to a temporary file and is renamed into place, so a killed run leaves either
the old file or the new one, never half of one; rows are keyed by (cell_id, victim) and never doubled.

Integrity: adversarial examples, shards and per-image tables carry a ``<file>.sha256`` written
before the file is renamed into place. A file that disagrees with its checksum (bit rot, a
truncated copy, a write cut short) is reported in one line, deleted and rebuilt by the runner
(re-crafted, or its victims re-evaluated), never used; the analyses refuse it with one line.
A file without a checksum (written by a version before checksums) is used if it parses.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

import pandas as pd
import torch

from ..core import faults
from ..core.errors import UserError
from ..core.utils import atomic_path, atomic_write_text, remove_checked, checksum_matches


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class RunStore:
    """``log`` receives the one-line reports of corrupt files (default: stderr)."""

    def __init__(self, run_dir: str | Path, log: Callable[[str], None] = _stderr) -> None:
        self.root = Path(run_dir)
        self.log = log

    def _corrupt(self, path: Path, why: str, action: str) -> None:
        self.log(f"advtransfer: warning: {path} is corrupt ({why}); deleted, {action}")
        remove_checked(path)

    def _check(self, path: Path, action: str) -> bool:
        """False (after reporting and deleting the file) when ``path`` fails its checksum."""
        if checksum_matches(path) is False:
            self._corrupt(path, "checksum mismatch", action)
            return False
        return True

    # --- adversarial examples -------------------------------------------------------------
    def adv_path(self, cell_id: str) -> Path:
        return self.root / "adv" / f"{cell_id}.safetensors"

    def save_adv(self, cell_id: str, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        from safetensors.torch import save_file

        with atomic_path(self.adv_path(cell_id), checksum=True) as tmp:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp),
                      metadata={k: json.dumps(v) for k, v in meta.items()})
        self.packed_path(cell_id).unlink(missing_ok=True)  # a re-crafted packed cell has its examples again

    def packed_path(self, cell_id: str) -> Path:
        return self.root / "adv" / f"{cell_id}.packed"

    def is_packed(self, cell_id: str) -> bool:
        """Whether the cell's examples were left behind by ``advtransfer pack`` (its rows and
        per-image table stand without them; a victim they lack makes the cell re-crafted)."""
        return self.packed_path(cell_id).is_file()

    def mark_packed(self, cell_id: str, record: dict) -> None:
        """Write the cell's packed marker (JSON: what the left-behind examples were)."""
        atomic_write_text(self.packed_path(cell_id), json.dumps(record, indent=1, sort_keys=True) + "\n")

    def adv_intact(self, cell_id: str) -> bool:
        """Whether the cell's cached examples exist and match their checksum (a mismatch is
        reported and the file deleted, so the cell is re-crafted)."""
        path = self.adv_path(cell_id)
        return path.is_file() and self._check(path, "re-crafting the cell")

    def load_adv(self, cell_id: str) -> tuple[dict[str, torch.Tensor], dict] | None:
        """Cached tensors and metadata of a cell, or None if absent or corrupt (then reported
        and deleted, so the caller re-crafts)."""
        from safetensors import SafetensorError, safe_open

        path = self.adv_path(cell_id)
        if not path.is_file() or not self._check(path, "re-crafting the cell"):
            return None
        try:
            with safe_open(str(path), framework="pt") as fh:
                tensors = {k: fh.get_tensor(k) for k in fh.keys()}
                meta = {k: json.loads(v) for k, v in (fh.metadata() or {}).items()}
        except (SafetensorError, OSError, ValueError, json.JSONDecodeError) as exc:
            self._corrupt(path, f"unreadable: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                          "re-crafting the cell")
            return None
        return tensors, meta

    # --- shards -----------------------------------------------------------------------------
    def shard_path(self, cell_id: str) -> Path:
        return self.root / "shards" / f"{cell_id}.parquet"

    def _read_checked(self, path: Path, action: str) -> pd.DataFrame | None:
        """A checked parquet table, or None if absent or corrupt (reported and deleted)."""
        if not path.is_file() or not self._check(path, action):
            return None
        try:
            return pd.read_parquet(path)
        except Exception as exc:  # pyarrow raises several types for a damaged file
            self._corrupt(path, f"unreadable: {type(exc).__name__}", action)
            return None

    def _write_checked(self, path: Path, df: pd.DataFrame) -> None:
        with atomic_path(path, checksum=True) as tmp:
            df.to_parquet(tmp, index=False)

    def read_shard(self, cell_id: str) -> pd.DataFrame | None:
        """The cell's rows, or None if absent or corrupt (then its victims are re-evaluated)."""
        return self._read_checked(self.shard_path(cell_id), "re-evaluating the cell's victims")

    def write_shard(self, cell_id: str, rows: pd.DataFrame) -> None:
        self._write_checked(self.shard_path(cell_id), rows)

    def samples_path(self, cell_id: str) -> Path:
        return self.root / "samples" / f"{cell_id}.parquet"

    def read_samples(self, cell_id: str, required: bool = False) -> pd.DataFrame | None:
        """The cell's per-image table. ``required`` (the analyses): a missing or corrupt table is a
        one-line :class:`UserError` telling how to rebuild it; otherwise None."""
        path = self.samples_path(cell_id)
        if not required:
            return self._read_checked(path, "re-evaluating the cell's victims")
        if not path.is_file():
            raise UserError(f"{path} is missing: the run has no per-image results for cell {cell_id}; "
                            "rerun `advtransfer grid` on this run folder to write them")
        if checksum_matches(path) is False:
            raise UserError(f"{path} does not match its checksum (corrupt or truncated); rerun `advtransfer grid` "
                            "on this run folder to rebuild it")
        try:
            return pd.read_parquet(path)
        except Exception as exc:
            raise UserError(f"{path} is unreadable ({type(exc).__name__}); rerun `advtransfer grid` on this "
                            "run folder to rebuild it") from None

    def replace_samples(self, cell_id: str, df: pd.DataFrame) -> None:
        """Write the cell's whole per-image table (the analyses add measured columns)."""
        self._write_checked(self.samples_path(cell_id), df)

    def write_samples(self, cell_id: str, df: pd.DataFrame) -> None:
        """Write the rows of ``df``'s victims into the cell's per-image table (other victims kept)."""
        old = self.read_samples(cell_id)
        if old is not None:
            df = pd.concat([old[~old["victim"].isin(df["victim"].unique())], df], ignore_index=True)
        self._write_checked(self.samples_path(cell_id), df)

    def all_samples(self) -> pd.DataFrame:
        """Every cell's per-image table concatenated, each checked (empty frame when none)."""
        files = sorted(f for f in (self.root / "samples").glob("*.parquet") if not f.name.startswith("."))
        table = self.root / "results.parquet"
        if table.is_file():  # only the cells of the table (superseded cells keep their files, not their say)
            live = set(pd.read_parquet(table, columns=["cell_id"])["cell_id"])
            files = [f for f in files if f.stem in live]
        if not files:
            return pd.DataFrame()
        return pd.concat([self.read_samples(f.stem, required=True) for f in files], ignore_index=True)

    def remove_stale_temporaries(self) -> list[Path]:
        """Delete the temporary files (``.<name>.<random>.<ext>``) a killed writer left behind;
        returns them. Called when a run starts: a file is only ever complete under its own name."""
        stale = [f for d in (self.root, self.root / "adv", self.root / "shards", self.root / "samples") if d.is_dir()
                 for f in d.iterdir() if f.is_file() and f.name.startswith(".")]
        for f in stale:
            f.unlink(missing_ok=True)
        return stale

    def merge(self) -> pd.DataFrame:
        """Concatenate every shard into results.parquet and results.csv (atomically). Only complete
        shards count (``<cell_id>.parquet``; a writer's temporary files start with a dot)."""
        # oldest first: where two cells are the same grid entry (same surrogate row and replicate,
        # label, ε, seed), the one written last wins (all its victims' rows): an older attack version, or parameters
        # the grid file no longer has, leave the table (their files stay)
        shards = sorted((f for f in (self.root / "shards").glob("*.parquet") if not f.name.startswith(".")),
                        key=lambda f: (f.stat().st_mtime_ns, f.name))
        parts = [t for t in (self.read_shard(p.stem) for p in shards) if t is not None]
        if not parts:
            return pd.DataFrame()
        df = pd.concat(parts, ignore_index=True)
        df = df.drop_duplicates(subset=["cell_id", "victim"], keep="last")
        key = [c for c in ("surrogate", "replicate", "attack_label", "eps", "seed") if c in df.columns]
        cells = df.drop_duplicates("cell_id", keep="last")  # in shard order: oldest first
        newest = set(cells.drop_duplicates(subset=key, keep="last")["cell_id"]) if key else set(cells["cell_id"])
        gone = set(cells["cell_id"]) - newest
        df = df[df["cell_id"].isin(newest)]
        if gone:
            self.log(f"advtransfer: {len(gone)} cell(s) superseded by newer cells of the same grid entry "
                     f"(a new attack version or changed parameters) left out of the table; their files stay: "
                     f"{', '.join(sorted(gone)[:5])}{' ...' if len(gone) > 5 else ''}")
        order = ["surrogate", "attack_label", "eps", "seed", "victim"]
        df = df.sort_values([c for c in order if c in df.columns], kind="stable").reset_index(drop=True)
        with atomic_path(self.root / "results.parquet") as tmp:
            df.to_parquet(tmp, index=False)
        faults.point("merge")
        with atomic_path(self.root / "results.csv") as tmp:
            df.to_csv(tmp, index=False)
        return df

    def read_results(self) -> pd.DataFrame:
        path = self.root / "results.parquet"
        if not path.is_file():
            raise UserError(f"{self.root} holds no results.parquet; run `advtransfer grid` first or check the path")
        try:
            return pd.read_parquet(path)
        except Exception as exc:  # pyarrow raises several types for a damaged file
            raise UserError(f"{path} is unreadable ({type(exc).__name__}: damaged or truncated); rerun the "
                            "`advtransfer grid` command that wrote this run folder: it keeps the finished cells "
                            "and merges the table again from RUN/shards") from None

    # --- manifest ---------------------------------------------------------------------------
    def write_manifest(self, manifest: dict) -> None:
        atomic_write_text(self.root / "manifest.json", json.dumps(manifest, indent=2, default=str))

    def read_manifest(self) -> dict:
        """The run's manifest ({} before the first run). ``reference`` is the grid spec's (None
        without one); manifests written before it was a field carry it only in the raw grid."""
        path = self.root / "manifest.json"
        if not path.is_file():
            return {}
        try:
            manifest = json.loads(path.read_text())
        except (ValueError, OSError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise UserError(f"{path} is unreadable ({type(exc).__name__}: damaged or truncated); delete it and "
                            "rerun the `advtransfer grid` command that wrote this run folder (finished cells are "
                            "kept) to write it again") from None
        if not isinstance(manifest, dict):
            raise UserError(f"{path} is not a JSON object; delete it and rerun the `advtransfer grid` command "
                            "that wrote this run folder (finished cells are kept) to write it again")
        if "reference" not in manifest:
            grid = manifest.get("grid")
            manifest["reference"] = grid.get("reference") if isinstance(grid, dict) else None
        return manifest
