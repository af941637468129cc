"""Training cost of the trained defences against plain and FGSM-RS training, side by side: what a
converged PubDef or DVERGE costs on this machine, as a ratio to the shipped FGSM-RS ResNet-20
(`resnet20_at`, whose converged card gives its minutes) and to a standard step.

Each method trains through :func:`advtransfer.training.train_from_recipe` (the code a zoo
training runs) for one epoch of ``--steps`` batches of ``--batch`` random pixels (the cost does
not depend on the values), 2 torch threads, fp32, with the converged zoo's architectures: a
ResNet-20 for the single-model methods, PubDef's public pool as in `victims/defended.yaml`
(a ResNet-20 and the airbench VGG), DVERGE on a three-ResNet-20 ensemble. Rounds alternate
between methods so that load on a shared machine hits all of them alike. Each run is timed twice:
wall clock, and the CPU time of this process (``time.process_time``: what the run's 2 threads
consumed, which other jobs on a shared machine inflate far less than the wall clock); the median
of ``--reps`` rounds is reported as images/s and as minutes per 50,000 images, and the ratios to
a standard and an FGSM-RS epoch are taken from the CPU times.

    python benchmarks/bench_defences.py [--batch 128] [--steps 1] [--reps 3]
                                        [--at-steps 3,5] [--distill-steps 3,10]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch


def _split(n: int):
    from advtransfer.data import CIFAR10_CLASSES, Split

    g = np.random.default_rng(0)
    return Split("cifar10", "train", g.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
                 g.integers(0, 10, n).astype(np.int64), tuple(CIFAR10_CLASSES))


def _net(arch: str, **kw):
    from advtransfer.models.archs import CIFAR10_MEAN, CIFAR10_STD, ImageClassifier, build_arch

    return ImageClassifier(build_arch(arch, **kw), CIFAR10_MEAN, CIFAR10_STD)


def _methods(at_steps: list[int], distill_steps: list[int]) -> dict[str, tuple]:
    """name: (recipe extras, network builder, whether it trains against the public pool)."""
    resnet = {"depth": 20}
    out: dict[str, tuple] = {
        "standard": ({"method": "standard"}, lambda: _net("resnet", **resnet), False),
        "fgsm_at": ({"method": "fgsm_at", "at_eps": "8/255", "at_alpha": "10/255"}, lambda: _net("resnet", **resnet), False),
    }
    for k in at_steps:
        out[f"pubdef k={k}"] = ({"method": "pubdef", "at_eps": "8/255", "at_steps": k, "sources": ["resnet20_a", "vgg_a"]},
                                lambda: _net("resnet", **resnet), True)
    for d in distill_steps:
        out[f"dverge d={d}"] = ({"method": "dverge", "distill_steps": d, "distill_alpha": 0.07 / d, "lr": 0.02},
                                lambda: _net("ensemble", members=3, member_arch="resnet", member_kwargs=resnet), False)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--at-steps", default="3,5", help="PubDef's PGD steps to time (comma-separated)")
    ap.add_argument("--distill-steps", default="3,10", help="DVERGE's distillation steps to time")
    args = ap.parse_args(argv)
    from advtransfer.training import TrainingContext, train_from_recipe

    torch.set_num_threads(2)
    data = _split(args.batch * args.steps)
    torch.manual_seed(1)
    sources = {"resnet20_a": _net("resnet", depth=20).eval(), "vgg_a": _net("vgg").eval()}
    base = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4, "schedule": "onecycle",
            "batch_size": args.batch, "augment": ["crop", "flip"], "epochs": 1, "seed": 0}
    methods = _methods([int(v) for v in args.at_steps.split(",") if v], [int(v) for v in args.distill_steps.split(",") if v])
    times: dict[str, list[float]] = {m: [] for m in methods}
    cpu: dict[str, list[float]] = {m: [] for m in methods}

    def once(name: str) -> tuple[float, float]:
        extra, build, pool = methods[name]
        torch.manual_seed(0)
        ctx = TrainingContext(name=name, progress=False, sources=sources if pool else {})
        net = build()
        t0, c0 = time.perf_counter(), time.process_time()
        train_from_recipe(net, {**base, **extra}, data, ctx)
        return time.perf_counter() - t0, time.process_time() - c0

    for name in methods:  # warm-up
        once(name)
        print(f"  warm-up {name}", file=sys.stderr)
    for _ in range(args.reps):
        for name in methods:
            wall, used = once(name)
            times[name].append(wall)
            cpu[name].append(used)
    n = args.batch * args.steps
    std = statistics.median(cpu["standard"])
    fgsm = statistics.median(cpu["fgsm_at"])
    print(f"one training epoch of {n} random images at batch {args.batch}, 2 threads, fp32 (median of "
          f"{args.reps} rounds): wall img/s and min per 50,000 images; CPU-seconds per image (both threads) "
          f"and its ratio to a standard and an FGSM-RS epoch")
    for name in methods:
        t, c = statistics.median(times[name]), statistics.median(cpu[name])
        print(f"  {name:14s} wall {n / t:7.1f} img/s {t / n * 50000 / 60:6.1f} min/epoch   "
              f"cpu {c / n * 1000:6.1f} ms/img  {c / std:5.2f}x standard  {c / fgsm:5.2f}x fgsm_at", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
