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


def dct_matrix(n: int) -> torch.Tensor:
    """Orthonormal DCT-II matrix D (n×n, float64): DCT of a length-n vector v is D·v, inverse Dᵀ."""
    k = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    i = torch.arange(n, dtype=torch.float64).unsqueeze(0)
    d = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    d[0] /= math.sqrt(2.0)
    return d


def dct_2d(x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """2-D DCT over the last two axes of ``x`` (…×H×W, H = W = len(d))."""
    d = d.to(x)
    return d @ x @ d.T


def idct_2d(c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`dct_2d`."""
    d = d.to(c)
    return d.T @ c @ d


class SpectrumSimulation:
    """SSA (Long et al. 2022): x ↦ IDCT(DCT(x + ξ) ⊙ M), ξ ~ N(0, σ²) and M ~ U(1 − ρ, 1 + ρ) per
    pixel, drawn per image from its generator. As in the authors' code the gradient is taken at
    the transformed image (straight through: the attack ascends ∇L at the spectrum copy, not
    through the mask), so the forward value is the copy and the backward pass the identity."""

    def __init__(self, gens: list[torch.Generator], sigma: float, rho: float, dct: torch.Tensor) -> None:
        self.gens, self.sigma, self.rho, self.dct = gens, float(sigma), float(rho), dct

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape[1:]
        xi = torch.stack([torch.randn(shape, generator=g) for g in self.gens]).to(x) * self.sigma
        m = torch.stack([torch.rand(shape, generator=g) for g in self.gens]).to(x) * 2 * self.rho + 1 - self.rho
        with torch.no_grad():
            copy = idct_2d(dct_2d(x + xi, self.dct) * m, self.dct)
        return x + (copy - x).detach()


def _split_lengths(total: int, parts: int, g: torch.Generator) -> list[int]:
    """``parts`` random positive lengths summing to ``total`` (proportional to U(0,1) draws)."""
    if parts <= 1 or total < parts:
        return [total]
    r = torch.rand(parts, generator=g, dtype=torch.float64)
    lens = [max(1, int(round(float(v)))) for v in r / r.sum() * total]
    lens[max(range(parts), key=lambda k: lens[k])] += total - sum(lens)
    return lens if min(lens) >= 1 else [total // parts] * (parts - 1) + [total - (total // parts) * (parts - 1)]


def _rotate(x: torch.Tensor, degrees: float) -> torch.Tensor:
    """Rotate ``x`` (1×C×H×W) by ``degrees`` about its centre, zero fill, nearest sampling
    (torchvision's RandomRotation defaults); differentiable in x."""
    t = math.radians(degrees)
    h, w = x.shape[-2:]
    # affine_grid works in normalised coordinates; correct for a non-square strip
    theta = torch.tensor([[math.cos(t), -math.sin(t) * h / w, 0.0],
                          [math.sin(t) * w / h, math.cos(t), 0.0]], dtype=x.dtype, device=x.device).unsqueeze(0)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)


class BlockShuffleRotation:
    """BSR (Wang et al. 2024): split the image into ``blocks`` strips of random widths along a
    random axis and shuffle them; rotate each strip by an angle in [−degrees, degrees]; split it
    into ``blocks`` pieces along the other axis and shuffle those. Per image, from its generator;
    differentiable (the gradient flows back through the shuffle and the rotation)."""

    def __init__(self, gens: list[torch.Generator], blocks: int = 2, degrees: float = 24.0) -> None:
        self.gens, self.blocks, self.degrees = gens, int(blocks), float(degrees)

    def _one(self, x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        first = 2 if float(torch.rand((), generator=g)) < 0.5 else 3
        second = 5 - first
        strips = list(torch.split(x, _split_lengths(x.shape[first], self.blocks, g), dim=first))
        strips = [strips[k] for k in torch.randperm(len(strips), generator=g).tolist()]
        out = []
        for s in strips:
            angle = (float(torch.rand((), generator=g)) * 2 - 1) * self.degrees
            s = _rotate(s, angle)
            pieces = list(torch.split(s, _split_lengths(s.shape[second], self.blocks, g), dim=second))
            out.append(torch.cat([pieces[k] for k in torch.randperm(len(pieces), generator=g).tolist()], dim=second))
        return torch.cat(out, dim=first)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self._one(x[i:i + 1], g) for i, g in enumerate(self.gens)])
