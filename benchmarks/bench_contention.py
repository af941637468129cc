"""Benchmark: two torch jobs sharing the cores, with OpenMP's default and with passive waiting.

One job is a ResNet-20 (the harness's ``resnet``, depth 20) training step of 128 CIFAR-size
images at 2 torch threads (forward, backward, SGD step), repeated. Four settings, each its own
processes, interleaved over ``--rounds`` so a noisy machine affects all alike: one job alone and two
jobs started together, each with and without ``OMP_WAIT_POLICY=PASSIVE``. Prints the median
seconds a step per setting and the slowdown of two jobs against one (2.0: the fair share of the
cores). The test suite's workers (tests/conftest.py) and any two claims runs sharing a machine
(claims/README.md) rest on this ratio.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

STEP = """
import time, torch, torch.nn.functional as F
from advtransfer.models.archs import ImageClassifier, build_arch
torch.set_num_threads({threads})
torch.manual_seed(0)
net = ImageClassifier(build_arch("resnet", depth=20)).train()
x, y = torch.rand(128, 3, 32, 32), torch.randint(0, 10, (128,))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
def step():
    opt.zero_grad(); F.cross_entropy(net(x), y).backward(); opt.step()
for _ in range(2):
    step()
t = time.perf_counter()
for _ in range({steps}):
    step()
print((time.perf_counter() - t) / {steps})
"""


def jobs(k: int, passive: bool, steps: int, threads: int) -> list[float]:
    """Start ``k`` step-timing processes together; returns each one's seconds a step."""
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    code = STEP.format(threads=threads, steps=steps)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(k)]
    out = []
    for p in procs:
        stdout, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"a timing process failed (exit {p.returncode})")
        out.append(float(stdout.strip().splitlines()[-1]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the four settings")
    ap.add_argument("--steps", type=int, default=6, help="timed training steps per process")
    ap.add_argument("--threads", type=int, default=2, help="torch threads per job (the harness's default: 2)")
    args = ap.parse_args(argv)
    settings = [(1, False), (2, False), (1, True), (2, True)]
    times: dict[tuple[int, bool], list[float]] = {s: [] for s in settings}
    for _ in range(args.rounds):
        for k, passive in settings:
            times[(k, passive)] += jobs(k, passive, args.steps, args.threads)
    med = {s: statistics.median(v) for s, v in times.items()}
    print(f"ResNet-20 training step, 128 images, {args.threads} threads a job; median seconds a step "
          f"({args.rounds} rounds, {args.steps} steps each)")
    for passive in (False, True):
        name = "OMP_WAIT_POLICY=PASSIVE" if passive else "OpenMP default"
        one, two = med[(1, passive)], med[(2, passive)]
        print(f"  {name:24s} alone {one:.3f} s   two side by side {two:.3f} s each   slowdown {two / one:.2f}x")
    print(f"  passive alone / default alone: {med[(1, True)] / med[(1, False)]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
