"""Per-sample tensor operations shared by attacks. Every norm is taken per sample (dim 0 is the
batch), so one image's result never depends on its batch neighbours. Pixels are in [0,1]."""
from __future__ import annotations

import torch

_TINY = 1e-12


def per_sample_norm(t: torch.Tensor, p: float) -> torch.Tensor:
    """L_p norm of each sample, shaped N×1×1×1 for broadcasting."""
    flat = t.flatten(1)
    if p == 1:
        n = flat.abs().sum(1)
    elif p == 2:
        n = flat.norm(p=2, dim=1)
    elif p == float("inf"):
        n = flat.abs().amax(1)
    else:
        raise ValueError(f"unsupported norm p={p}")
    return n.view(-1, *([1] * (t.dim() - 1)))


def normalize(t: torch.Tensor, p: float) -> torch.Tensor:
    """``t / ‖t‖_p`` per sample (zero stays zero)."""
    return t / per_sample_norm(t, p).clamp_min(_TINY)


def momentum_term(g: torch.Tensor) -> torch.Tensor:
    """MI-FGSM's increment ``g / mean|g|`` per sample: the L1 normalisation of the paper, scaled by
    the number of elements as in the authors' code (and torchattacks). Sign steps do not see the
    scale, but NI-FGSM's look-ahead ``α·μ·g`` does: with it the look-ahead moves about one step."""
    return normalize(g, 1) * g[0].numel()


def ascent_direction(g: torch.Tensor, norm: str) -> torch.Tensor:
    """Steepest-ascent direction of unit size: sign(g) for L∞, g/‖g‖₂ per sample for L2."""
    if norm == "linf":
        return g.sign()
    if norm == "l2":
        return normalize(g, 2)
    raise ValueError(f"unknown norm {norm!r}")


def project(x_adv: torch.Tensor, x: torch.Tensor, eps: float, norm: str) -> torch.Tensor:
    """Project ``x_adv`` onto the ε-ball around ``x`` (per sample) and onto [0,1]."""
    delta = x_adv - x
    if norm == "linf":
        delta = delta.clamp(-eps, eps)
    elif norm == "l2":
        n = per_sample_norm(delta, 2)
        delta = delta * torch.where(n > eps, eps / n.clamp_min(_TINY), torch.ones_like(n))
    else:
        raise ValueError(f"unknown norm {norm!r}")
    return (x + delta).clamp(0.0, 1.0)


def random_in_ball(x: torch.Tensor, eps: float, norm: str, gens: list[torch.Generator]) -> torch.Tensor:
    """A uniform random point of the ε-ball around each sample (L∞: uniform cube; L2: uniform
    ball), drawn with one generator per sample, then clipped to [0,1]."""
    shape = x.shape[1:]
    if norm == "linf":
        d = torch.stack([torch.rand(shape, generator=g) * 2 - 1 for g in gens]) * eps
    else:
        dirs = torch.stack([torch.randn(shape, generator=g) for g in gens])
        radius = torch.stack([torch.rand((), generator=g) for g in gens]) ** (1.0 / dirs[0].numel())
        d = normalize(dirs, 2) * radius.view(-1, 1, 1, 1) * eps
    return (x + d.to(x.device, x.dtype)).clamp(0.0, 1.0)
