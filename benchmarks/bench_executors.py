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


def passes_time(spec, n: int) -> tuple[float, dict[str, float]]:
    """The grid's time if it were nothing but model passes: each cell's surrogate
    forward+backward passes and every forward pass of the evaluation (victims' clean labels once
    per run, each cell's adversarial images through each victim, the surrogate's clean labels per
    cell), each at the per-image time measured here for that model (input-gradient passes in
    batches of the grid's batch size, forward passes in one batch of n). Returns (seconds, the
    per-model times in ms per image)."""
    import torch
    import torch.nn.functional as F

    from advtransfer.core.accel import time_passes
    from advtransfer.data import eval_subset, load_dataset
    from advtransfer.grid import expand_cells, resolve_attack
    from advtransfer.models import zoo

    x, y, _ = eval_subset(load_dataset(spec.dataset, spec.split), n)
    shas = {m: zoo.read_card(m, spec.size)["sha256"] for m in spec.model_names()}
    t_grad, t_fwd = {}, {}
    for m in spec.model_names():
        model = zoo.load_model(m, spec.size, member=0)
        xb, yb = x[:spec.batch_size], y[:spec.batch_size]

        def grad():
            xg = xb.clone().requires_grad_(True)
            torch.autograd.grad(F.cross_entropy(model(xg), yb, reduction="sum"), xg)

        def fwd():
            with torch.inference_mode():
                model(x)

        grad(), fwd()  # warm-up
        med = time_passes({"grad": grad, "fwd": fwd}, 5)
        t_grad[m], t_fwd[m] = med["grad"] / len(xb), med["fwd"] / len(x)
    total = sum(n * t_fwd[v] for v in spec.victims)  # clean labels, once per run
    for cell in expand_cells(spec, shas):
        ms = cell.surrogate.models
        attack = resolve_attack(cell.attack, spec, cell.eps, cell.seed, len(ms))
        per_model = attack.grad_evals_formula(len(ms)) / len(ms)
        total += sum(n * per_model * t_grad[m] + n * t_fwd[m] for m in ms)
        total += sum(n * t_fwd[v] for v in spec.victims)
    return total, {m: 1000 * t_grad[m] for m in t_grad} | {f"{m} (forward)": 1000 * t_fwd[m] for m in t_fwd}


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
    floor, per_model = passes_time(spec, args.n)
    print("per-image pass times (ms; input-gradient passes, and forward passes): "
          + ", ".join(f"{k} {v:.2f}" for k, v in per_model.items()))
    print(f"sum of the grid's model passes at those times: {floor:.1f} s; serial wall / passes = {s / floor:.2f}x "
          f"(the rest: process start, imports, loading models, writing files, merging the table)")


if __name__ == "__main__":
    main()
