"""Files of a run folder: cached adversarial examples, per-cell shards, merged tables, manifest.

RUN_DIR/
  adv/<cell_id>.safetensors      x_adv float32 N×C×H×W, index int64 N (+ target, delta)
  shards/<cell_id>.parquet       the cell's rows, one per victim (rewritten atomically)
  samples/<cell_id>.parquet      per-image results (victim, index, success, l2)
  results.parquet, results.csv   all shards merged
  manifest.json                  resolved grid, versions, git sha, zoo cards
Every write goes to a temporary file and is renamed into place, so a killed run leaves either
the old file or the new one, never half of one; rows are keyed by (cell_id, victim) and never doubled.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import torch

from .errors import UserError
from .utils import atomic_path, atomic_write_text


class RunStore:
    def __init__(self, run_dir: str | Path) -> None:
        self.root = Path(run_dir)

    # --- adversarial examples -------------------------------------------------------------
    def adv_path(self, cell_id: str) -> Path:
        return self.root / "adv" / f"{cell_id}.safetensors"

    def save_adv(self, cell_id: str, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        from safetensors.torch import save_file

        with atomic_path(self.adv_path(cell_id)) as tmp:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp),
                      metadata={k: json.dumps(v) for k, v in meta.items()})

    def load_adv(self, cell_id: str) -> tuple[dict[str, torch.Tensor], dict] | None:
        """Cached tensors and metadata of a cell, or None if absent."""
        from safetensors import SafetensorError, safe_open

        path = self.adv_path(cell_id)
        if not path.is_file():
            return None
        try:
            with safe_open(str(path), framework="pt") as fh:
                tensors = {k: fh.get_tensor(k) for k in fh.keys()}
                meta = {k: json.loads(v) for k, v in (fh.metadata() or {}).items()}
        except (SafetensorError, OSError, ValueError, json.JSONDecodeError) as exc:
            raise UserError(f"cached examples {path} are unreadable ({exc}); delete the file to re-craft") from None
        return tensors, meta

    # --- shards -----------------------------------------------------------------------------
    def shard_path(self, cell_id: str) -> Path:
        return self.root / "shards" / f"{cell_id}.parquet"

    def read_shard(self, cell_id: str) -> pd.DataFrame | None:
        path = self.shard_path(cell_id)
        if not path.is_file():
            return None
        return pd.read_parquet(path)

    def write_shard(self, cell_id: str, rows: pd.DataFrame) -> None:
        with atomic_path(self.shard_path(cell_id)) as tmp:
            rows.to_parquet(tmp, index=False)

    def write_samples(self, cell_id: str, df: pd.DataFrame) -> None:
        path = self.root / "samples" / f"{cell_id}.parquet"
        old = pd.read_parquet(path) if path.is_file() else None
        if old is not None:
            df = pd.concat([old[~old["victim"].isin(df["victim"].unique())], df], ignore_index=True)
        with atomic_path(path) as tmp:
            df.to_parquet(tmp, index=False)

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
        shards = sorted(f for f in (self.root / "shards").glob("*.parquet") if not f.name.startswith("."))
        if not shards:
            return pd.DataFrame()
        df = pd.concat([pd.read_parquet(p) for p in shards], ignore_index=True)
        df = df.drop_duplicates(subset=["cell_id", "victim"], keep="last")
        order = ["surrogate", "attack_label", "eps", "seed", "victim"]
        df = df.sort_values([c for c in order if c in df.columns], kind="stable").reset_index(drop=True)
        with atomic_path(self.root / "results.parquet") as tmp:
            df.to_parquet(tmp, index=False)
        with atomic_path(self.root / "results.csv") as tmp:
            df.to_csv(tmp, index=False)
        return df

    def read_results(self) -> pd.DataFrame:
        path = self.root / "results.parquet"
        if not path.is_file():
            raise UserError(f"{self.root} holds no results.parquet; run `advtransfer grid` first or check the path")
        return pd.read_parquet(path)

    # --- manifest ---------------------------------------------------------------------------
    def write_manifest(self, manifest: dict) -> None:
        atomic_write_text(self.root / "manifest.json", json.dumps(manifest, indent=2, default=str))

    def read_manifest(self) -> dict:
        path = self.root / "manifest.json"
        return json.loads(path.read_text()) if path.is_file() else {}
