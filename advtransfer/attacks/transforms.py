"""Input and gradient transforms for transfer attacks at CIFAR scale (32×32).

Both are per sample: each image draws its own random resize/padding from its own generator.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

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
    """``parts`` random positive lengths summing to ``total`` (proportional to U(0,1) draws): the
    split of BSR version 1 (``form: v1``)."""
    if parts <= 1 or total < parts:
        return [total]
    r = torch.rand(parts, generator=g, dtype=torch.float64)
    lens = [max(1, int(round(float(v)))) for v in r / r.sum() * total]
    lens[max(range(parts), key=lambda k: lens[k])] += total - sum(lens)
    return lens if min(lens) >= 1 else [total // parts] * (parts - 1) + [total - (total // parts) * (parts - 1)]


def authors_lengths(rand: torch.Tensor, total: int) -> list[int]:
    """TransferAttack's ``BSR.get_length`` for given draws ``rand`` (float64, one per block):
    ``round(rand / rand.sum() * total)`` (round half to even, as ``np.round``), then the first
    largest length absorbs the rounding remainder (``rand_norm[rand_norm.argmax()] += length -
    rand_norm.sum()``)."""
    lens = [int(v) for v in torch.round(rand.double() / rand.double().sum() * total).tolist()]
    lens[max(range(len(lens)), key=lambda k: lens[k])] += total - sum(lens)
    return lens


def authors_draw_lengths(total: int, parts: int, g: torch.Generator) -> list[int]:
    """Random block lengths along one axis as TransferAttack's BSR draws them: ``rand =
    np.random.uniform(2, size=num_block)``, which is uniform on (1, 2] (numpy's ``low + (high −
    low)·U`` with low = 2, high = 1), so every block gets between 1/(2n−1) and 2/(n+1) of the
    axis; see :func:`authors_lengths`. A length below one pixel is a UserError."""
    lens = authors_lengths(2.0 - torch.rand(parts, generator=g, dtype=torch.float64), total)
    if min(lens) < 1:
        from ..core.errors import UserError

        raise UserError(f"bsr: {parts} blocks do not fit in {total} pixels")
    return lens


def _rotate(x: torch.Tensor, degrees: float) -> torch.Tensor:
    """Rotate ``x`` (1×C×H×W) by ``degrees`` about its centre, zero fill, nearest sampling
    (BSR version 1); differentiable in x."""
    t = math.radians(degrees)
    h, w = x.shape[-2:]
    # affine_grid works in normalised coordinates; correct for a non-square strip
    theta = torch.tensor([[math.cos(t), -math.sin(t) * h / w, 0.0],
                          [math.sin(t) * w / h, math.cos(t), 0.0]], dtype=x.dtype, device=x.device).unsqueeze(0)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)


def rotate_bilinear(x: torch.Tensor, degrees: float) -> torch.Tensor:
    """Rotate ``x`` (N×C×H×W) counter-clockwise by ``degrees`` about its centre, bilinear, as
    ``torchvision.transforms.RandomRotation(..., interpolation=BILINEAR)`` does to a tensor with
    its default ``fill=0``: the sampling grid of ``_functional_tensor.rotate`` (pixel centres,
    inverse rotation [[cos, −sin], [sin, cos]], normalised by half the width and height,
    ``grid_sample(align_corners=False)``, zero padding), and the fill blend ``img·mask +
    (1 − mask)·0`` with ``mask`` the rotated all-ones channel (so pixels that straddle the border
    are darkened a second time). Differentiable in x."""
    t = math.radians(degrees)
    n, c, h, w = x.shape
    xs = torch.linspace(-w * 0.5 + 0.5, w * 0.5 - 0.5, w, dtype=x.dtype, device=x.device)
    ys = torch.linspace(-h * 0.5 + 0.5, h * 0.5 - 0.5, h, dtype=x.dtype, device=x.device)
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    grid = torch.stack([(math.cos(t) * gx - math.sin(t) * gy) / (0.5 * w),
                        (math.sin(t) * gx + math.cos(t) * gy) / (0.5 * h)], dim=-1)
    grid = grid.unsqueeze(0).expand(n, h, w, 2)
    ones = torch.ones(n, 1, h, w, dtype=x.dtype, device=x.device)
    out = F.grid_sample(torch.cat([x, ones], 1), grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out[:, :c] * out[:, c:]


#: BSR transform forms: TransferAttack's (the BSR authors' PyTorch code) and version 1 of the harness
BSR_FORMS = ("authors", "v1")


@dataclass
class BSRDraw:
    """The random choices of one BSR copy of one image: ``first`` (the axis cut into strips, 2 =
    rows or 3 = columns; the other is cut second), ``lengths`` (strip sizes, pixels), ``order``
    (strip order after the shuffle: output strip k is input strip ``order[k]``), and per output
    strip: ``angles`` (its rotation, degrees counter-clockwise), ``piece_lengths`` and
    ``piece_orders`` (its cut along the other axis and the shuffle of the pieces)."""

    first: int
    lengths: list[int]
    order: list[int]
    angles: list[float] = field(default_factory=list)
    piece_lengths: list[list[int]] = field(default_factory=list)
    piece_orders: list[list[int]] = field(default_factory=list)


def draw_bsr(shape: Sequence[int], blocks: int, degrees: float, g: torch.Generator, form: str = "authors") -> BSRDraw:
    """The choices of one BSR copy of an image of ``shape`` (C×H×W), drawn from ``g`` in the order
    the transform makes them. ``authors``: axis order as ``random.shuffle([2, 3])``, lengths as
    :func:`authors_draw_lengths`, orders uniform permutations (``random.shuffle``), angles uniform
    in [−degrees, degrees] drawn in float32 as ``RandomRotation.get_params`` does. ``v1``: lengths
    proportional to U(0,1) draws (:func:`_split_lengths`), angles in float64, the rest the same."""
    size = {2: int(shape[-2]), 3: int(shape[-1])}
    split = authors_draw_lengths if form == "authors" else _split_lengths
    first = 2 if float(torch.rand((), generator=g)) < 0.5 else 3
    second = 5 - first
    lengths = split(size[first], blocks, g)
    d = BSRDraw(first, lengths, torch.randperm(len(lengths), generator=g).tolist())
    for _ in d.order:
        if form == "authors":  # RandomRotation.get_params: a float32 draw, uniform in [-degrees, degrees]
            d.angles.append(float(torch.empty(1).uniform_(-float(degrees), float(degrees), generator=g).item()))
        else:
            d.angles.append((float(torch.rand((), generator=g)) * 2 - 1) * degrees)
        pl = split(size[second], blocks, g)
        d.piece_lengths.append(pl)
        d.piece_orders.append(torch.randperm(len(pl), generator=g).tolist())
    return d


def apply_bsr(x: torch.Tensor, d: BSRDraw, form: str = "authors") -> torch.Tensor:
    """One BSR copy of ``x`` (N×C×H×W, every image with the same choices ``d``), as TransferAttack's
    ``BSR.shuffle``: cut ``x`` into strips along ``d.first`` and shuffle them; rotate each strip
    (``authors``: :func:`rotate_bilinear`; ``v1``: nearest, :func:`_rotate`); cut each rotated
    strip along the other axis and shuffle the pieces; concatenate. Differentiable in x."""
    second = 5 - d.first
    strips = list(torch.split(x, d.lengths, dim=d.first))
    out = []
    for k, src in enumerate(d.order):
        s = rotate_bilinear(strips[src], d.angles[k]) if form == "authors" else _rotate(strips[src], d.angles[k])
        pieces = list(torch.split(s, d.piece_lengths[k], dim=second))
        out.append(torch.cat([pieces[j] for j in d.piece_orders[k]], dim=second))
    return torch.cat(out, dim=d.first)


class BlockShuffleRotation:
    """BSR (Wang et al. 2024): split the image into ``blocks`` strips of random widths along a
    random axis and shuffle them; rotate each strip by an angle in [−degrees, degrees]; split it
    into ``blocks`` pieces along the other axis and shuffle those (:func:`draw_bsr`,
    :func:`apply_bsr`). ``form``: ``authors`` (TransferAttack's block sizes and bilinear
    rotation) or ``v1`` (BSR version 1: sizes proportional to U(0,1) draws, nearest rotation).
    Per image, from its generator; differentiable (the gradient flows back through the shuffle
    and the rotation)."""

    def __init__(self, gens: list[torch.Generator], blocks: int = 2, degrees: float = 24.0,
                 form: str = "authors") -> None:
        if form not in BSR_FORMS:
            from ..core.errors import UserError

            raise UserError(f"bsr: form must be one of {', '.join(BSR_FORMS)}, got {form!r}")
        self.gens, self.blocks, self.degrees, self.form = gens, int(blocks), float(degrees), form

    def draws(self, shape: Sequence[int]) -> list[BSRDraw]:
        """The next copy's choices for every image (advances the generators)."""
        return [draw_bsr(shape, self.blocks, self.degrees, g, self.form) for g in self.gens]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([apply_bsr(x[i:i + 1], d, self.form) for i, d in enumerate(self.draws(x.shape[1:]))])
