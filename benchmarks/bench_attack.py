"""Benchmark: the harness's MI-FGSM step time against a bare autograd loop and torchattacks.

All three run on the same model (CIFAR ResNet-20, eval mode; the weights do not affect timing)
and the same batch of 128 real CIFAR-10 test images (random pixels if no data folder is set),
interleaved round by round so machine noise hits all of them alike. Prints medians and ratios.
Targets: harness / bare loop within 1.05; harness / torchattacks at most 1.0 (± noise).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def bare_mifgsm(model, x, y, eps, alpha, steps, mu=1.0):
    """The same forward/backward passes written by hand: the lower bound."""
    x_adv, g = x.clone(), torch.zeros_like(x)
    for _ in range(steps):
        xa = x_adv.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(F.cross_entropy(model(xa), y, reduction="sum"), xa)
        g = mu * g + grad / grad.abs().flatten(1).sum(1).clamp_min(1e-12).view(-1, 1, 1, 1)
        x_adv = torch.min(torch.max(x_adv + alpha * g.sign(), x - eps), x + eps).clamp(0, 1)
    return x_adv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--arch", default="resnet")
    args = ap.parse_args()

    from advtransfer.attacks import SurrogateSet, create_attack
    from advtransfer.models.zoo import load_specs

    try:
        from advtransfer.data import eval_subset, load_cifar10

        x, y, idx = eval_subset(load_cifar10("test"), args.batch)
        src = "CIFAR-10 test images"
    except Exception:  # benchmark still runs without data
        x, y, idx = torch.rand(args.batch, 3, 32, 32), torch.randint(0, 10, (args.batch,)), torch.arange(args.batch)
        src = "random pixels"
    spec = next(s for s in load_specs().values() if s.arch == args.arch)
    model = spec.build().eval()
    for p in model.parameters():
        p.requires_grad_(False)
    eps, steps = 8 / 255, args.steps
    alpha = eps / steps
    attack = create_attack("mifgsm", eps=eps, steps=steps)
    runners = {
        "harness": lambda: attack(SurrogateSet(model), x, y, idx),
        "bare_loop": lambda: bare_mifgsm(model, x, y, eps, alpha, steps),
    }
    try:
        import torchattacks

        ta = torchattacks.MIFGSM(model, eps=eps, alpha=alpha, steps=steps, decay=1.0)
        runners["torchattacks"] = lambda: ta(x, y)
    except ImportError:
        print("torchattacks not installed: skipping that comparison")
    for fn in runners.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(args.rounds):
        for name, fn in runners.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) / steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"MI-FGSM, {spec.name} ({spec.arch}), batch {args.batch} of {src}, {steps} steps, "
          f"{args.rounds} interleaved rounds, {torch.get_num_threads()} threads")
    for k, v in med.items():
        print(f"  {k:13s} median {1000 * v:8.2f} ms/step  (min {1000 * min(times[k]):.2f})")
    print(f"ratio harness / bare_loop    = {med['harness'] / med['bare_loop']:.3f}  (target <= 1.05)")
    if "torchattacks" in med:
        print(f"ratio harness / torchattacks = {med['harness'] / med['torchattacks']:.3f}  (target <= 1.00)")


if __name__ == "__main__":
    main()
