"""Benchmark: HopSkipJump (advtransfer.analysis.measures.blackbox.hsja) before and after batching its
victim queries in cache-sized chunks.

Before: the queries of all images went to the victim in forward passes of 2,000 images. On a CPU
that is about twice as slow per image as passes of 128-256 (the activations of 2,000 32×32 images
do not stay in cache). After: ``default_chunk`` (128 on a CPU). Same victim, same images, same
seeds, runs interleaved (before, after, before, ...); prints each run's seconds, the medians, the
ratio, and whether the two settings found the same distortions (a chunk changes no query, but
convolution rounding can differ with the batch size, so points within float rounding of the
boundary may be answered differently).

The victim is the harness's resnet20 at random initialisation (``--victim NAME`` for a trained
zoo model, ``--size``, ``$ADVTRANSFER_CACHE``); with random weights the labels are the model's own
predictions, so every image is "clean-correct" and spends the full budget, as on a trained victim.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--victim", help="trained zoo model (default: resnet20 at random initialisation)")
    ap.add_argument("--size", default="ci")
    ap.add_argument("--n", type=int, default=10, help="CIFAR-10 test images 0..n-1")
    ap.add_argument("--budget", type=int, default=1000, help="queries per image")
    ap.add_argument("--norm", default="l2", choices=["l2", "linf"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before-chunk", type=int, default=2000)
    args = ap.parse_args()
    from advtransfer.analysis.measures.blackbox import default_chunk, hsja
    from advtransfer.data import eval_subset, load_dataset

    x, y, index = eval_subset(load_dataset("cifar10", "test"), args.n, 0)
    if args.victim:
        from advtransfer.models import zoo

        model = zoo.load_model(args.victim, args.size, None, "cpu", member=0)
    else:
        from advtransfer.models.archs import CIFAR10_MEAN, CIFAR10_STD, ImageClassifier, build_arch

        torch.manual_seed(0)
        model = ImageClassifier(build_arch("resnet", depth=20), CIFAR10_MEAN, CIFAR10_STD, channels_last=True).eval()
        with torch.no_grad():
            y = model(x).argmax(1)
    after_chunk = default_chunk("cpu")
    times: dict[str, list[float]] = {"before": [], "after": []}
    outs = {}
    budgets = sorted({min(100, args.budget), args.budget})
    for r in range(args.repeats):
        for name, chunk in (("before", args.before_chunk), ("after", after_chunk)):
            t0 = time.perf_counter()
            outs[name] = hsja(model, x, y, budgets, args.norm, index, seed=0, chunk=chunk)
            times[name].append(time.perf_counter() - t0)
            print(f"run {r + 1} {name:6s} (chunk {chunk:4d}): {times[name][-1]:7.1f} s", flush=True)
    mb, ma = statistics.median(times["before"]), statistics.median(times["after"])
    q = int(outs["after"]["queries"].sum())
    print(f"\nHopSkipJump {args.norm}, {args.n} images x {args.budget} queries ({q} victim queries per run), "
          f"torch threads {torch.get_num_threads()}")
    print(f"median before (chunk {args.before_chunk}): {mb:.1f} s   after (chunk {after_chunk}): {ma:.1f} s   "
          f"speed-up before/after: {mb / ma:.2f}x   ({1000 * ma / q:.2f} ms per query after)")
    same = all(torch.equal(outs["before"][k], outs["after"][k]) for k in ("min_l2", "min_linf", "queries"))
    print("same distortions and query counts before and after:", "yes" if same else
          f"no (largest relative difference in min L2: "
          f"{float(((outs['before']['min_l2'] - outs['after']['min_l2']).abs() / outs['after']['min_l2']).nan_to_num().max()):.2e})")


if __name__ == "__main__":
    main()
