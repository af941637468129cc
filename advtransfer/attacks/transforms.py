"""Input and gradient transforms for transfer attacks at CIFAR scale (32×32).

Both are per sample: each image draws its own random resize/padding from its own generator.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class InputDiversity:
    """DI (Xie et al. 2019): with probability ``prob`` per image, resize to a random size in
    [⌊H·resize_rate⌋, H) (nearest) and zero-pad back to H×W at a random offset. The default
    resize_rate 0.9 gives 28..31 px at 32×32 (as torchattacks does); the ImageNet 299→330 setting
    would be resize_rate 1.1, which here means resizing up to 32..35 and padding to 35."""

    def __init__(self, gens: list[torch.Generator], resize_rate: float = 0.9, prob: float = 0.5) -> None:
        self.gens, self.rate, self.prob = gens, float(resize_rate), float(prob)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.prob <= 0:
            return x
        h = x.shape[-1]
        lo, hi = (int(h * self.rate), h) if self.rate < 1 else (h, int(h * self.rate))
        outs = []
        for i, g in enumerate(self.gens):
            apply = float(torch.rand((), generator=g)) < self.prob
            rnd = int(torch.randint(lo, hi, (), generator=g)) if hi > lo else lo
            pad = hi - rnd
            top = int(torch.randint(0, pad + 1, (), generator=g))
            left = int(torch.randint(0, pad + 1, (), generator=g))
            xi = x[i:i + 1]
            if apply:
                xi = F.interpolate(xi, size=(rnd, rnd), mode="nearest")
                xi = F.pad(xi, (left, pad - left, top, pad - top))
            elif hi != h:  # keep the output size fixed
                xi = F.pad(xi, (0, hi - h, 0, hi - h))
            outs.append(xi)
        return torch.cat(outs)


def gaussian_kernel(size: int = 5, nsig: float = 3.0) -> torch.Tensor:
    """Normalised size×size Gaussian kernel on linspace(−nsig, nsig), as in TI-FGSM's code."""
    xs = torch.linspace(-nsig, nsig, size, dtype=torch.float64)
    k1 = torch.exp(-0.5 * xs ** 2) / math.sqrt(2 * math.pi)
    k = torch.outer(k1, k1)
    return (k / k.sum()).float()


def translation_invariant(g: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """TI (Dong et al. 2019): convolve each channel of the gradient with ``kernel`` (same padding)."""
    c = g.shape[1]
    w = kernel.to(g).expand(c, 1, *kernel.shape).contiguous()
    return F.conv2d(g, w, padding=kernel.shape[-1] // 2, groups=c)
