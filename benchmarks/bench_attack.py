"""Benchmark: the harness's MI-FGSM step time against a bare autograd loop, torchattacks and
torchattack (the PyPI package), in three settings: one CIFAR ResNet-20; a 3-model logit ensemble
(ResNet-20, VGG, MobileNet); an LGV-style collection of 5 ResNet-20 weight sets drawing one per
step. The peers see the ensemble and the collection through a wrapper module doing the same passes.

Every runner works on the same models (eval mode; the weights do not affect timing) and the same
batch of 128 real CIFAR-10 test images (random pixels if no data folder is set), interleaved round by
round so machine noise hits all of them alike. Prints medians and ratios.
Targets: harness / bare loop within 1.05; harness / peers at most 1.0 (± noise).

Then, in the harness itself: an LGV collection drawing 3 members per step, one after another
against ``vectorise: true`` (stacked weights through vmap); and ``compile: auto`` (each model timed
eager against torch.compile, the faster kept) against torchattacks on the eager model, for the
ResNet-20, VGG, MobileNet and ViT architectures: targets >= 1.2x where compiled, never below 0.98x.
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


class LogitEnsemble(torch.nn.Module):
    """The mean of the members' logits (what the harness's logit ensemble differentiates)."""

    def __init__(self, members):
        super().__init__()
        self.members = torch.nn.ModuleList(members)

    def forward(self, x):
        return sum(m(x) for m in self.members) / len(self.members)


class Cycle(torch.nn.Module):
    """One member per forward pass, in a fixed cycle (an LGV collection drawing one per step)."""

    def __init__(self, members):
        super().__init__()
        self.members = torch.nn.ModuleList(members)
        self.k = 0

    def forward(self, x):
        m = self.members[self.k % len(self.members)]
        self.k += 1
        return m(x)


def _frozen(spec, seed: int):
    torch.manual_seed(seed)
    m = spec.build().eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def _time(runners: dict, rounds: int, steps: int) -> dict[str, float]:
    for fn in runners.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(rounds):
        for name, fn in runners.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) / steps)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--only", choices=("peers", "vectorise", "compile"),
                    help="run one part: the peers comparison, vectorised members, or compile: auto")
    args = ap.parse_args()

    from advtransfer.attacks import SurrogateSet, create_attack
    from advtransfer.models.catalogue import get_spec
    from advtransfer.models.collections import MemberCollection

    try:
        from advtransfer.data import eval_subset, load_cifar10

        x, y, idx = eval_subset(load_cifar10("test"), args.batch)
        src = "CIFAR-10 test images"
    except Exception:  # benchmark still runs without data
        x, y, idx = torch.rand(args.batch, 3, 32, 32), torch.randint(0, 10, (args.batch,)), torch.arange(args.batch)
        src = "random pixels"
    try:
        import torchattacks
    except ImportError:
        torchattacks = None
        print("torchattacks not installed: skipping that comparison")
    try:
        import torchattack
    except ImportError:
        torchattack = None
        print("torchattack not installed: skipping that comparison")
    eps, steps = 8 / 255, args.steps
    alpha = eps / steps
    attack = create_attack("mifgsm", eps=eps, steps=steps)
    res, vgg, mob = get_spec("resnet20_a"), get_spec("vgg_a"), get_spec("mobilenet_a")
    single = _frozen(res, 0)
    members3 = [single, _frozen(vgg, 1), _frozen(mob, 2)]
    lgv = [_frozen(res, 10 + k) for k in range(5)]
    settings = {
        "one ResNet-20": (lambda: SurrogateSet(single), lambda: single),
        "3-model logit ensemble": (lambda: SurrogateSet(members3), lambda: LogitEnsemble(members3)),
        "LGV collection (5 members, 1 per step)": (lambda: SurrogateSet(MemberCollection(lgv, 1, 0)), lambda: Cycle(lgv)),
    }
    print(f"MI-FGSM, batch {args.batch} of {src}, {steps} steps, {args.rounds} interleaved rounds, "
          f"{torch.get_num_threads()} threads; median ms per attack step")
    for title, (harness_set, peer_model) in (settings.items() if args.only in (None, "peers") else []):
        runners = {"harness": lambda hs=harness_set: attack(hs(), x, y, idx),
                   "bare_loop": lambda pm=peer_model: bare_mifgsm(pm(), x, y, eps, alpha, steps)}
        if torchattacks is not None:
            runners["torchattacks"] = lambda pm=peer_model: torchattacks.MIFGSM(pm(), eps=eps, alpha=alpha, steps=steps,
                                                                               decay=1.0)(x, y)
        if torchattack is not None:
            runners["torchattack"] = lambda pm=peer_model: torchattack.MIFGSM(pm(), device=torch.device("cpu"), eps=eps,
                                                                             alpha=alpha, steps=steps, decay=1.0)(x, y)
        med = _time(runners, args.rounds, steps)
        print(f"{title}: " + ", ".join(f"{k} {1000 * v:.1f}" for k, v in med.items()))
        for peer in ("bare_loop", "torchattacks", "torchattack"):
            if peer in med:
                target = "<= 1.05" if peer == "bare_loop" else "<= 1.00"
                print(f"  ratio harness / {peer:12s} = {med['harness'] / med[peer]:.3f}  (target {target})")
    # vectorising same-architecture members (torch.func, stacked parameters, vmap: the collection
    # option vectorise: true) against the members one after another, in the harness itself
    from advtransfer.core.accel import choose_compiled

    if args.only in (None, "vectorise"):
        runners = {
            "sequential": lambda: attack(SurrogateSet(MemberCollection(lgv[:3], 3, 0)), x, y, idx),
            "vectorised": lambda: attack(SurrogateSet(MemberCollection(lgv[:3], 3, 0, vectorise=True)), x, y, idx),
        }
        med = _time(runners, args.rounds, steps)
        print(f"LGV collection drawing 3 members per step: sequential {1000 * med['sequential']:.1f} ms, vectorised "
              f"{1000 * med['vectorised']:.1f} ms per step; ratio sequential / vectorised = "
              f"{med['sequential'] / med['vectorised']:.3f} (> 1 favours vectorise: true)")
    # torch.compile as the harness chooses it (compile: auto): timed per model, kept where faster
    if torchattacks is None or args.only not in (None, "compile"):
        return
    for name in ("resnet20_a", "vgg_a", "mobilenet_a", "vit_a"):
        try:
            spec = get_spec(name)
        except Exception:  # noqa: BLE001 - a model the catalogue lacks is skipped
            continue
        model = _frozen(spec, 0)
        chosen, info = choose_compiled(model, x, y)
        runners = {"harness_auto": lambda m=chosen: attack(SurrogateSet(m), x, y, idx),
                   "torchattacks": lambda m=model: torchattacks.MIFGSM(m, eps=eps, alpha=alpha, steps=steps, decay=1.0)(x, y)}
        med = _time(runners, args.rounds, steps)
        target = ">= 1.2" if info["choice"] == "compiled" else ">= 0.98"
        print(f"{name} with compile: auto ({info['choice']}; pass eager {info['eager_ms']:.1f} ms, compiled "
              f"{info['compiled_ms']:.1f} ms; compiling {info['compile_s']:.0f} s): harness "
              f"{1000 * med['harness_auto']:.1f} ms, torchattacks {1000 * med['torchattacks']:.1f} ms per step; "
              f"speed-up over torchattacks = {med['torchattacks'] / med['harness_auto']:.3f} (target {target})")

if __name__ == "__main__":
    main()
