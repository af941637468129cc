"""Perturbation generators of the generative attack kind (:mod:`advtransfer.attacks.generative`).

Every generator maps images x (N×C×H×W, pixels in [0,1]) — and, when conditional, one condition
vector per image (N×D: a target class's embedding) — to a raw map r of x's shape; :func:`bound`
turns r into a perturbation inside the ε-ball *by construction*: δ = ε·tanh(r) for L∞ (every pixel
in (−ε, ε)), δ = r·min(1, ε/‖r‖₂) per sample for L2. Clipping x + δ to [0,1] only shrinks |δ|,
so x_adv = clip(x + δ, 0, 1) stays in the ball whatever the weights are. :func:`project_image` is
the authors' form instead (CDA's ``train.py``): r is squashed into an image and that image is
projected onto the ball (``output: image`` of the generative attacks).

:class:`ResnetGenerator` is the image-to-image network of the cross-domain generative attacks
(CDA, Naseer et al. 2019; BIA, Zhang et al. 2022; FACL and PDCL build on it): a 7×7 stem, two
stride-2 down-sampling convolutions, residual blocks at ¼ resolution, two transposed up-sampling
convolutions and a 7×7 output convolution, with batch norm and ReLU. At CIFAR size the default
width is 16 with 2 residual blocks (the papers: 64 and 6 at 224 px); both are parameters.

:class:`ConditionalResnetGenerator` adds what the multi-target generators add (CGNC, Fang et al.
2024): the condition vector is projected to a feature map concatenated with the image at the
input (vision-language fusion), and each residual block of the bottleneck is followed by a
cross-attention module whose queries are the feature map's positions and whose keys and values
are condition tokens (the condition vector projected to ``n_tokens`` tokens). :class:`FlowVelocity`
is the same network with the integration time as a further input channel (Dual-Flow's velocity).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

_TINY = 1e-12



def bound(r: torch.Tensor, eps: float, norm: str) -> torch.Tensor:
    """The perturbation δ (same shape as r) for raw generator output r, inside the ε-ball per
    sample by construction: ε·tanh(r) for ``linf``, r scaled down to L2 norm ε where larger for ``l2``."""
    if norm == "linf":
        return eps * torch.tanh(r)
    if norm == "l2":
        # r = s·u with s = max|r| per sample, so ‖r‖ = s‖u‖ never overflows (a float32 map of entries
        # ~1e20 has an infinite norm); δ = r·min(1, ε/‖r‖) = u·min(s, ε/‖u‖)
        shape = (-1, *([1] * (r.dim() - 1)))
        s = r.flatten(1).abs().amax(1).clamp_min(_TINY).view(shape)
        u = r / s
        return u * torch.minimum(s, eps / u.flatten(1).norm(dim=1).clamp_min(_TINY).view(shape))
    raise ValueError(f"unknown norm {norm!r}")


def project_image(r: torch.Tensor, x: torch.Tensor, eps: float, norm: str) -> torch.Tensor:
    """x_adv for a generator whose raw output r *is an image* (CDA's ``train.py``: the generator ends
    in (tanh(r) + 1)/2, pixels in [0,1]): that image projected onto the ε-ball around x (L∞: clamped
    to [x − ε, x + ε] entrywise, as CDA's ``torch.min(torch.max(adv, img - eps), img + eps)``; L2: its
    difference to x scaled down to norm ε per sample), then clipped to [0,1]. Shapes N×C×H×W.
    Where an entry is clamped, no gradient reaches the generator through it (as in CDA)."""
    img = (torch.tanh(r) + 1) / 2
    if norm == "linf":
        adv = torch.min(torch.max(img, x - eps), x + eps)
    elif norm == "l2":
        adv = x + bound(img - x, eps, "l2")
    else:
        raise ValueError(f"unknown norm {norm!r}")
    return adv.clamp(0, 1)


class _ResBlock(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.ReflectionPad2d(1), nn.Conv2d(ch, ch, 3, bias=False), nn.BatchNorm2d(ch), nn.ReLU(True),
            nn.ReflectionPad2d(1), nn.Conv2d(ch, ch, 3, bias=False), nn.BatchNorm2d(ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class CrossAttention(nn.Module):
    """Multi-head cross-attention from a feature map (queries: its H·W positions) to condition
    tokens (keys and values), added to the map residually (pre-norm on the queries; the output
    projection starts at zero, so a new module is the identity)."""

    def __init__(self, ch: int, cond_dim: int, heads: int = 4) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(1, ch)
        self.attn = nn.MultiheadAttention(ch, heads, kdim=cond_dim, vdim=cond_dim, batch_first=True)
        nn.init.zeros_(self.attn.out_proj.weight)  # zero-initialised output (CGNC's proj_out): the
        nn.init.zeros_(self.attn.out_proj.bias)    # module starts as the identity

    def forward(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        n, c, hh, ww = h.shape
        q = self.norm(h).flatten(2).transpose(1, 2)          # N×HW×C
        out, _ = self.attn(q, tokens, tokens, need_weights=False)
        return h + out.transpose(1, 2).reshape(n, c, hh, ww)


class ResnetGenerator(nn.Module):
    """Image-to-image generator (CDA/BIA style). ``in_ch``: input channels (3 image channels plus any
    condition or time channels); ``width``: channels of the first layer (×2, ×4 after the two
    down-samplings); ``blocks``: residual blocks at ¼ resolution. Output: the raw map r (N×3×H×W)."""

    def __init__(self, width: int = 16, blocks: int = 2, in_ch: int = 3) -> None:
        super().__init__()
        w = width
        self.stem = nn.Sequential(nn.ReflectionPad2d(3), nn.Conv2d(in_ch, w, 7, bias=False), nn.BatchNorm2d(w), nn.ReLU(True))
        self.down = nn.Sequential(
            nn.Conv2d(w, 2 * w, 3, 2, 1, bias=False), nn.BatchNorm2d(2 * w), nn.ReLU(True),
            nn.Conv2d(2 * w, 4 * w, 3, 2, 1, bias=False), nn.BatchNorm2d(4 * w), nn.ReLU(True))
        self.blocks = nn.ModuleList(_ResBlock(4 * w) for _ in range(blocks))
        self.up = nn.Sequential(
            nn.ConvTranspose2d(4 * w, 2 * w, 3, 2, 1, output_padding=1, bias=False), nn.BatchNorm2d(2 * w), nn.ReLU(True),
            nn.ConvTranspose2d(2 * w, w, 3, 2, 1, output_padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(True))
        self.head = nn.Sequential(nn.ReflectionPad2d(3), nn.Conv2d(w, 3, 7))

    def trunk(self, inp: torch.Tensor, tokens: torch.Tensor | None = None) -> torch.Tensor:
        h = self.down(self.stem(inp))
        for k, blk in enumerate(self.blocks):
            h = blk(h)
            h = self.after_block(k, h, tokens)
        return self.head(self.up(h))

    def after_block(self, k: int, h: torch.Tensor, tokens: torch.Tensor | None) -> torch.Tensor:
        return h

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        return self.trunk(x)


class ConditionalResnetGenerator(ResnetGenerator):
    """:class:`ResnetGenerator` conditioned on one vector per image (N×``cond_dim``): the vector is
    projected to a ``fuse_ch``-channel map concatenated with the input, and to ``n_tokens`` tokens
    that every residual block's cross-attention module reads (CGNC's design)."""

    def __init__(self, cond_dim: int, width: int = 16, blocks: int = 2, n_tokens: int = 4, fuse_ch: int = 16,
                 extra_in: int = 0, token_dim: int = 64) -> None:
        super().__init__(width, blocks, in_ch=3 + fuse_ch + extra_in)
        self.cond_dim, self.n_tokens, self.fuse_ch, self.token_dim = cond_dim, n_tokens, fuse_ch, token_dim
        self.fuse = nn.Linear(cond_dim, fuse_ch)
        self.to_tokens = nn.Sequential(nn.Linear(cond_dim, n_tokens * token_dim), nn.GELU())
        self.xattn = nn.ModuleList(CrossAttention(4 * width, token_dim) for _ in range(blocks))

    def after_block(self, k: int, h: torch.Tensor, tokens: torch.Tensor | None) -> torch.Tensor:
        return self.xattn[k](h, tokens)

    def condition(self, x: torch.Tensor, cond: torch.Tensor, extra: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the network input: x, the fused condition map and any ``extra`` channels; the tokens)."""
        n, _, hh, ww = x.shape
        fmap = self.fuse(cond).view(n, self.fuse_ch, 1, 1).expand(n, self.fuse_ch, hh, ww)
        parts = [x, fmap] + ([extra] if extra is not None else [])
        tokens = self.to_tokens(cond).view(n, self.n_tokens, self.token_dim)
        return torch.cat(parts, 1), tokens

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        if cond is None:
            raise ValueError("a conditional generator needs one condition vector per image")
        inp, tokens = self.condition(x, cond)
        return self.trunk(inp, tokens)


class FlowVelocity(ConditionalResnetGenerator):
    """A conditional velocity field v(x_t, t, c) for Dual-Flow's reverse flow: the conditional
    generator with the time t ∈ [0,1] as one more constant input channel and a learned time
    embedding added to the condition tokens."""

    def __init__(self, cond_dim: int, width: int = 16, blocks: int = 2, n_tokens: int = 4, token_dim: int = 64) -> None:
        super().__init__(cond_dim, width, blocks, n_tokens, extra_in=1, token_dim=token_dim)
        self.time = nn.Sequential(nn.Linear(16, token_dim), nn.GELU(), nn.Linear(token_dim, token_dim))

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None = None, t_time: float = 0.0) -> torch.Tensor:  # type: ignore[override]
        if cond is None:
            raise ValueError("the velocity field needs one condition vector per image")
        n, _, hh, ww = x.shape
        t = float(t_time)
        tmap = torch.full((n, 1, hh, ww), t, dtype=x.dtype, device=x.device)
        inp, tokens = self.condition(x, cond, tmap)
        freqs = torch.exp(torch.arange(8, dtype=x.dtype, device=x.device) * (-math.log(1000.0) / 8))
        temb = torch.cat([torch.sin(t * 1000.0 * freqs), torch.cos(t * 1000.0 * freqs)])
        tokens = tokens + self.time(temb)[None, None, :]
        return self.trunk(inp, tokens)


def count_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


__all__ = ["bound", "ResnetGenerator", "ConditionalResnetGenerator", "FlowVelocity", "CrossAttention", "count_params"]
