"""A run folder without its adversarial examples: what a finished or interrupted run needs to be
resumed elsewhere, small enough to commit or copy.

A run's examples (``adv/<cell_id>.safetensors``: N×3×32×32 float32 a cell, 12,288 bytes an image)
are most of its size; its rows, per-image tables and manifest are a small fraction of it.
:func:`pack_run` copies the latter for every finished cell (a sound shard and a sound per-image
table, both matching their checksums) into a run folder ``dest`` and writes
``adv/<cell_id>.packed`` where each cell's examples were. ``advtransfer grid`` on ``dest`` (or on a
copy of it) then treats those cells as done: a rerun with the same grid crafts only the cells that
were not finished when the run was packed. A packed cell that must answer a new victim is crafted
again, and every one of its rows is derived from the new examples, as for a damaged examples file.

Packing into a folder that already holds a pack of the same run (the same resolved grid values,
e.g. the previous sitting of a long run) adds the new cells and keeps the others; a pack of another
grid is refused. The analyses that read examples (figures of universal perturbations, distortion,
the generative report's targets) skip or name the packed cells; the tables, comparisons and claims
read only rows and per-image tables.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..core.errors import UserError
from ..core.resources import portable_path
from ..core.utils import CHECKSUM_SUFFIX, atomic_path, checksum_matches, sha256_file
from .store import RunStore


@dataclass(frozen=True)
class Packed:
    """What :func:`pack_run` did: cells copied now, cells ``dest`` holds in all, cells of the run
    left out (unfinished or damaged), whether the run had finished, and ``dest``'s size in bytes."""

    new: int
    cells: int
    left_out: int
    finished: bool
    bytes: int


def _spec_of(manifest: dict) -> dict:
    """The resolved grid values that make two run folders one run (the CLI's --set and -n applied)."""
    return {k: v for k, v in (manifest.get("spec") or {}).items() if k not in ("executor", "workers")}


def _copy_checked(src: Path, dst: Path) -> None:
    """Copy ``src`` and its checksum file to ``dst`` (the checksum first, then the file, each renamed into
    place), so ``dst`` is never a file without the checksum it must match."""
    for a, b in ((src.with_name(src.name + CHECKSUM_SUFFIX), dst.with_name(dst.name + CHECKSUM_SUFFIX)), (src, dst)):
        if a.is_file():
            with atomic_path(b) as tmp:
                shutil.copyfile(a, tmp)


def finished_cells(store: RunStore) -> list[str]:
    """Cells of ``store`` whose shard and per-image table exist and match their checksums, and whose
    per-image table covers every victim of the shard (what a rerun would not evaluate again), sorted."""
    import pandas as pd

    out = []
    for shard in sorted((store.root / "shards").glob("*.parquet")):
        cid = shard.stem
        if cid.startswith("."):
            continue
        samples = store.samples_path(cid)
        if not samples.is_file() or checksum_matches(shard) is False or checksum_matches(samples) is False:
            continue
        if not (store.adv_path(cid).is_file() and checksum_matches(store.adv_path(cid)) is not False) \
                and not store.is_packed(cid):
            continue  # without its examples a rerun crafts it again: not finished
        try:
            rows = pd.read_parquet(shard, columns=["victim"])
            per_image = pd.read_parquet(samples, columns=["victim"])
        except Exception:
            continue
        if set(rows["victim"]) <= set(per_image["victim"]):
            out.append(cid)
    return out


def pack_run(run: str | Path, dest: str | Path) -> Packed:
    """Copy the finished cells of run folder ``run`` into run folder ``dest`` without their
    examples (see the module docstring). Both folders are locked while it works; bad input (no run
    folder, ``dest`` inside ``run`` or holding another grid's run or examples) is one
    :class:`UserError` before anything is written."""
    from ..core.lock import RunLock

    run, dest = Path(run), Path(dest)
    if not (run / "manifest.json").is_file():
        raise UserError(f"{run} is not a run folder (no manifest.json); pass the folder `advtransfer grid --out` wrote")
    if dest.resolve() == run.resolve() or dest.resolve().is_relative_to(run.resolve()):
        raise UserError(f"the pack {dest} must lie outside the run folder {run}; pass another folder")
    src = RunStore(run, log=lambda _m: None)
    manifest = src.read_manifest()
    if dest.exists() and not dest.is_dir():
        raise UserError(f"{dest} is a file; pass a folder for the pack")
    old: dict = {}
    if dest.is_dir() and any(dest.iterdir()):
        if not (dest / "manifest.json").is_file():
            raise UserError(f"{dest} holds files but no run; pass an empty or new folder for the pack")
        old = RunStore(dest, log=lambda _m: None).read_manifest()
        if _spec_of(old) != _spec_of(manifest):
            raise UserError(f"{dest} holds a pack of another run (run {old.get('run_id')!r}, other grid values "
                            f"than {run}'s); pack into a new folder")
        if any((dest / "adv").glob("*.safetensors")):
            raise UserError(f"{dest} is a run folder with adversarial examples, not a pack; pack into a new folder")
    with RunLock(run), RunLock(dest):
        out = RunStore(dest, log=lambda _m: None)
        out.remove_stale_temporaries()
        # only the cells of the run's table: a cell superseded by a newer one of the same grid entry is left
        # behind (merge() tells them apart by file age, which a copy or a git checkout does not keep)
        live = set(src.merge()["cell_id"]) if any((run / "shards").glob("*.parquet")) else set()
        cells = [c for c in finished_cells(src) if c in live]
        had = set(finished_cells(out)) if old else set()
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        for cid in cells:
            for d in ("shards", "samples", "adv"):
                (dest / d).mkdir(parents=True, exist_ok=True)
            _copy_checked(src.shard_path(cid), out.shard_path(cid))
            _copy_checked(src.samples_path(cid), out.samples_path(cid))
            if src.is_packed(cid):  # packed before: its marker says what the examples were
                record = json.loads(src.packed_path(cid).read_text())
            else:
                adv = src.adv_path(cid)
                record = {"examples": adv.name, "sha256": sha256_file(adv), "bytes": adv.stat().st_size,
                          "packed_at": now}
            out.mark_packed(cid, record)
        merged = dict(old)
        merged.update(manifest)
        merged["cells"] = {**(old.get("cells") or {}), **(manifest.get("cells") or {})}
        merged["created_at"] = min(x for x in (old.get("created_at"), manifest.get("created_at")) if x) \
            if (old.get("created_at") or manifest.get("created_at")) else now
        every = sorted(set(merged["cells"]))
        held = set(finished_cells(out))
        # finished only when every cell of the run's grid is held (a pack of an unfinished run is not)
        grid_cells = manifest.get("finished_cells") or []
        merged["finished_at"] = manifest.get("finished_at") if manifest.get("finished_at") and set(grid_cells) <= held else None
        if merged["finished_at"] is None:
            merged.pop("finished_cells", None)
        merged["packed"] = [*(old.get("packed") or []),
                            {"at": now, "from_run": manifest.get("run_id"), "git_sha": manifest.get("git_sha"),
                             "cells": len(cells), "finished": bool(manifest.get("finished_at"))}]
        merged["updated_at"] = now
        raw_grid = manifest.get("grid_file")
        merged["grid_file"] = portable_path(raw_grid)
        out.write_manifest(merged)
        if (run / "run.log").is_file():  # what each sitting printed, in order
            log = (dest / "run.log").read_text() if (dest / "run.log").is_file() else ""
            add = (run / "run.log").read_text()
            if raw_grid and merged["grid_file"] != raw_grid:
                add = add.replace(str(raw_grid), str(merged["grid_file"]))
            text = add if add.startswith(log) else log if add in log else log + add  # a resumed copy repeats the pack's log
            with atomic_path(dest / "run.log") as tmp:
                tmp.write_text(text)
        if held:
            out.merge()
        left = len(set(manifest.get("cells") or every) - set(cells))
    nbytes = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    return Packed(new=len(set(cells) - had), cells=len(held), left_out=left,
                  finished=merged["finished_at"] is not None, bytes=nbytes)


__all__ = ["Packed", "finished_cells", "pack_run"]
