"""Training-step throughput of the converged zoo's architectures: eager (contiguous memory),
eager channels_last, torch.compile'd channels_last, and a SAM step (channels_last, two passes: the
converged SAM arms' step, rho 0.05), measured side by side in one run.

One step = forward, sum-of-CE backward and an SGD (Nesterov) update on a batch of random pixels
(the cost does not depend on the values), 2 torch threads, fp32. Each variant is warmed up, then
the median of ``--reps`` rounds of ``--steps`` steps is reported as images/s with its ratio to
eager. Rounds alternate between variants so that load on a shared machine hits all of them alike.

    python benchmarks/bench_train.py [--archs airbench,resnet20] [--batch 512] [--steps 3] [--reps 3]
                                     [--modes eager,channels_last,compiled,sam]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

ARCHS = {  # name: (registered arch, kwargs) as the converged catalogue builds them
    "airbench": ("airbench", {}),
    "resnet20": ("resnet", {"depth": 20}),
    "mobilenet": ("mobilenet", {"width": 12}),
    "densenet": ("densenet", {"growth": 12, "blocks": [3, 3, 3]}),
    "vit": ("vit", {"embed_dim": 128, "depth": 4, "num_heads": 4}),
    # candidates for the converged zoo's mobile, dense and attention slots
    "mobilenet24": ("mobilenet", {"width": 24}),
    "densenet40": ("densenet", {"growth": 12, "blocks": [6, 6, 6]}),
    "cct": ("cct", {}),
}


def _variant(arch: str, kwargs: dict, mode: str):
    from advtransfer.models.archs import CIFAR10_MEAN, CIFAR10_STD, ImageClassifier, build_arch

    from advtransfer.training.sam import sam_backward

    torch.manual_seed(0)
    cl = mode != "eager"
    net = ImageClassifier(build_arch(arch, **kwargs), CIFAR10_MEAN, CIFAR10_STD, channels_last=cl).train()
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=1e-3, momentum=0.9, nesterov=True)
    fwd = torch.compile(net) if mode == "compiled" else net
    sam = sam_backward(0.05, reduction="sum") if mode == "sam" else None

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        if sam is None:
            F.cross_entropy(fwd(x), y, reduction="sum").backward()
        else:
            sam(net, x, y, 0.0)
        opt.step()

    return step


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--modes", default="eager,channels_last,compiled,sam")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    modes = args.modes.split(",")
    x = torch.rand(args.batch, 3, 32, 32)
    y = torch.randint(0, 10, (args.batch,))
    print(f"training step, batch {args.batch}, 2 threads, fp32; images/s (median of {args.reps} rounds "
          f"of {args.steps} steps) and ratio to eager")
    for name in args.archs.split(","):
        arch, kwargs = ARCHS[name]
        if arch == "vit":  # the harness never puts attention models in channels_last
            run_modes = [m for m in modes if m not in ("channels_last", "sam")]
        else:
            run_modes = modes
        steps, times = {}, {m: [] for m in run_modes}
        for m in run_modes:
            t0 = time.perf_counter()
            steps[m] = _variant(arch, kwargs, m)
            steps[m](x, y)  # warm-up (compiles)
            steps[m](x, y)
            print(f"  {name:10s} {m:14s} warm-up {time.perf_counter() - t0:6.1f} s", file=sys.stderr)
        for _ in range(args.reps):
            for m in run_modes:
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    steps[m](x, y)
                times[m].append(args.steps * args.batch / (time.perf_counter() - t0))
        base = statistics.median(times[run_modes[0]])
        cells = [f"{m} {statistics.median(times[m]):6.1f}/s ({statistics.median(times[m]) / base:4.2f}x)"
                 for m in run_modes]
        print(f"{name:10s} " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
