"""Benchmark: what writing the results table costs for a dry grid of many cells.

Before this round the runner merged every shard into results.parquet/csv after *each* cell, so a
grid of C cells read 1 + 2 + ... + C shards and wrote the table C times: quadratic in C. It now
merges once per run (and once on interruption). This script builds C shard files of realistic
rows (one per victim), then times both strategies side by side: the per-cell merge on the first
``--sample`` cells (extrapolated to C by its quadratic cost), and the single merge of all C.
Prints table writes, shard reads and seconds for each, and their ratio.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pandas as pd


def fake_rows(cell: int, victims: int) -> pd.DataFrame:
    return pd.DataFrame({
        "cell_id": f"c{cell:05d}", "surrogate": f"s{cell}",  # one grid entry per cell (none supersedes another)
        "attack_label": f"a{cell % 13}",
        "eps": 8 / 255, "seed": 0, "victim": [f"v{v}" for v in range(victims)],
        "n_success": list(range(victims)), "asr": [v / victims for v in range(victims)],
        "attack_params": '{"eps": 0.0313, "steps": 10}', "created_at": "2026-11-30T00:00:00+00:00"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=2000)
    ap.add_argument("--victims", type=int, default=10)
    ap.add_argument("--sample", type=int, default=150, help="cells over which the per-cell merge is timed")
    args = ap.parse_args()
    from advtransfer.run.store import RunStore

    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(Path(tmp) / "run")
        # before: merge after every cell, measured on the first `sample` cells
        t0 = time.perf_counter()
        for c in range(args.sample):
            store.write_shard(f"c{c:05d}", fake_rows(c, args.victims))
            store.merge()
        per_cell_s = time.perf_counter() - t0
        for c in range(args.sample, args.cells):
            store.write_shard(f"c{c:05d}", fake_rows(c, args.victims))
        # after: one merge of every shard
        t0 = time.perf_counter()
        df = store.merge()
        once_s = time.perf_counter() - t0
    assert len(df) == args.cells * args.victims
    C, S = args.cells, args.sample
    before_reads = C * (C + 1) // 2
    # the per-cell merge costs ~ a + b·k for the k-th cell: extrapolate the measured sum over 1..S to 1..C
    before_s = per_cell_s * (before_reads / (S * (S + 1) / 2))
    print(f"dry grid: {C} cells x {args.victims} victims = {C * args.victims} rows")
    print(f"before (merge per cell): {C} table writes, {before_reads} shard reads, "
          f"~{before_s:.0f} s (measured {per_cell_s:.1f} s for the first {S} cells, extrapolated)")
    print(f"after  (merge per run):  1 table write, {C} shard reads, {once_s:.1f} s")
    print(f"ratio before/after: writes {C}x, shard reads {before_reads / C:.0f}x, time {before_s / once_s:.0f}x")


if __name__ == "__main__":
    main()
