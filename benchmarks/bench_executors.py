"""Benchmark: wall time of the ``ci`` grid under the serial executor and under ``local`` workers.

Runs the same grid (grids/ci.yaml: 12 cells, 6 victims, 200 images by default) into fresh run
folders, interleaved (serial, local, serial, local, ...) so that a noisy machine affects both
alike, and prints each wall time and the ratio of medians. The serial run uses every core in
one process (torch threads = cores); ``local`` splits the cores between worker processes.
The ci zoo models are trained into the cache first if missing (not timed).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(grid: str, out: Path, extra: list[str], n: int) -> float:
    cmd = [sys.executable, "-m", "advtransfer", "grid", grid, "--out", str(out), "-n", str(n), "--no-progress",
           "--no-plot", "--no-report", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="ci")
    ap.add_argument("-n", type=int, default=200, help="test images per cell")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    import torch

    from advtransfer.grid import load_grid
    from advtransfer.models import zoo

    spec = load_grid(args.grid)
    zoo.ensure_trained(spec.model_names(), spec.size, progress=False, log=lambda *_: None)  # not timed
    times: dict[str, list[float]] = {"serial": [], "local": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, extra in (("serial", []), ("local", ["--executor", "local", "--workers", str(args.workers)])):
                times[name].append(run(args.grid, Path(tmp) / f"{name}{r}", extra, args.n))
                print(f"  {name:6s} run {r + 1}: {times[name][-1]:6.1f} s", flush=True)
    s, l = statistics.median(times["serial"]), statistics.median(times["local"])
    print(f"grid {spec.name}: {len(spec.surrogates)} surrogate rows, n={args.n}, {torch.get_num_threads()} cores")
    print(f"serial (1 process x {torch.get_num_threads()} threads): median {s:.1f} s")
    print(f"local  ({args.workers} workers splitting the cores): median {l:.1f} s")
    print(f"ratio serial/local: {s / l:.2f}x (target >= 1.4x on a 2-core machine)")


if __name__ == "__main__":
    main()
