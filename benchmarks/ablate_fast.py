"""Ablation of the fast-training techniques (method ``fast``, airbench's recipe) on one net.

Trains airbench's net at ``--widths`` for ``--epochs`` on all 50,000 training images: once with the
whole recipe of the converged VGG slots, then once with each technique switched off, each from the
same seed, one at a time (2 torch threads; nothing else should run beside it). Prints clean
accuracy on the bit-exact test images 0-999 and on all 10,000, the difference to the whole recipe
in points, and the training time. One run per variant: differences under about one point are
within the spread of seeds (airbench's authors report a standard deviation of 0.1-0.2 points over
many runs on 10,000 images; a 1,000-image estimate alone has a standard error near 0.9 points).

    python benchmarks/ablate_fast.py [--epochs 5] [--widths 64,128,128] [--only full,no_lookahead]
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

#: variant name -> recipe changes (each switches one technique off)
VARIANTS: dict[str, dict] = {
    "full": {},
    "no_label_smoothing": {"label_smoothing": 0.0},
    "no_lookahead": {"lookahead": False},
    "no_whitening": {"whiten": False},
    "random_flip": {"flip": "random"},
    "no_translate": {"augment": ["flip"]},
    "no_bias_scaling": {"bias_scaler": 1.0},
    "no_warmup": {"warmup": 0.0},
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=float, default=5.0)
    ap.add_argument("--widths", default="64,128,128")
    ap.add_argument("--only", default="", help="comma-separated variants (default: all)")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    from advtransfer.data import load_cifar10
    from advtransfer.models.catalogue import get_spec
    from advtransfer.models.loading import whole_test_accuracy
    from advtransfer.training.context import TrainingContext
    from advtransfer.training.fast import train_fast

    names = [v for v in args.only.split(",") if v] or list(VARIANTS)
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        print(f"unknown variant(s) {', '.join(unknown)}; variants: {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    spec = get_spec("vgg_a")
    base = dict(spec.resolved_recipe("converged"), epochs=args.epochs)
    widths = [int(w) for w in args.widths.split(",")]
    train = load_cifar10("train")
    print(f"airbench widths {widths}, {args.epochs:g} epochs, 50,000 images, seed {base.get('seed', 0)}; "
          "clean accuracy without test-time augmentation", flush=True)
    print(f"{'variant':20s} {'test 0-999':>10s} {'all 10k':>8s} {'diff (pts, 0-999 / all)':>24s} {'time':>8s}", flush=True)
    ref = None
    for name in names:
        from advtransfer.models.archs import CIFAR10_MEAN, CIFAR10_STD, ImageClassifier, build_arch

        torch.manual_seed(int(base.get("seed", 0)))
        net = ImageClassifier(build_arch("airbench", widths=widths), CIFAR10_MEAN, CIFAR10_STD, channels_last=True)
        t0 = time.perf_counter()
        train_fast(net, dict(base, **VARIANTS[name]), train, TrainingContext(progress=False))
        secs = time.perf_counter() - t0
        acc = whole_test_accuracy(net.eval())
        if ref is None and name == "full":
            ref = acc
        diff = (f"{100 * (acc['lossless'] - ref['lossless']):+6.1f} / {100 * (acc['all'] - ref['all']):+5.2f}"
                if ref is not None else "")
        print(f"{name:20s} {100 * acc['lossless']:9.1f}% {100 * acc['all']:7.2f}% {diff:>24s} {secs / 60:6.1f} min",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
