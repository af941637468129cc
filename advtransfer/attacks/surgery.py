"""Backward-path surgery: a change to how gradients flow through a model, as one object applied to
the surrogate's modules for the length of an attack and removed afterwards (the forward values are
unchanged, so predictions and the cached model are untouched).

- :class:`SkipGradient` (SGM, Wu et al. 2020): the gradient through every residual branch is
  multiplied by γ, so ∂z_{i+1}/∂z_i = 1 + γ·∂f_i/∂z_i (the paper's decomposition); the skip paths
  carry the gradient unchanged.
- :class:`LinearBackward` (LinBP, Guo et al. 2020): every ReLU from a chosen layer on passes the
  gradient as if it were the identity (the forward pass keeps the ReLU).

Sites are found by structure: the residual blocks of the harness's ResNets and MobileNets, the
``BasicBlock``/``Bottleneck`` blocks of timm and torchvision ResNets, and timm transformer blocks; ReLUs are ``nn.ReLU`` modules
(the harness's architectures use modules, not ``F.relu``, for this reason), in module-registration
order, which is the forward order of the harness's architectures.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Sequence

import torch
import torch.nn as nn

from ..errors import UserError


class _GradScale(torch.autograd.Function):
    """Identity in the forward pass; multiplies the incoming gradient by ``s`` in the backward pass."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, s: float) -> torch.Tensor:  # type: ignore[override]
        ctx.s = s
        return x.clone()

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        return g * ctx.s, None


def scale_grad(x: torch.Tensor, s: float) -> torch.Tensor:
    """``x`` unchanged, with its gradient multiplied by ``s`` on the way back."""
    return _GradScale.apply(x, s)


def residual_branch_ends(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) whose output ends a residual branch (the tensor added to the skip path), in
    registration order, found by structure (the attack layer does not import the models): ``bn2``
    of a basic block (harness, timm, torchvision: ``conv2``/``bn2``, no ``bn3``), ``bn3`` of a
    bottleneck, ``block`` of a harness inverted residual that has a skip connection
    (``residual: True``), ``ls1`` and ``ls2`` (the attention and MLP branches) of a timm
    transformer block."""
    out = []
    for name, m in model.named_modules():
        if hasattr(m, "conv3") and isinstance(getattr(m, "bn3", None), nn.Module):
            out.append((f"{name}.bn3", m.bn3))
        elif hasattr(m, "conv2") and isinstance(getattr(m, "bn2", None), nn.Module) and hasattr(m, "conv1"):
            out.append((f"{name}.bn2", m.bn2))
        elif getattr(m, "residual", None) is True and isinstance(getattr(m, "block", None), nn.Module):
            out.append((f"{name}.block", m.block))
        elif isinstance(getattr(m, "ls1", None), nn.Module) and isinstance(getattr(m, "ls2", None), nn.Module):
            # timm transformer block: x + ls1(attn(norm1(x))), then x + ls2(mlp(norm2(x)))
            out += [(f"{name}.ls1", m.ls1), (f"{name}.ls2", m.ls2)]
    return out


def relu_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of the model's ``nn.ReLU`` modules in registration order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ReLU)]


class Surgery:
    """Base class: :meth:`attach` changes one model's backward pass and returns the callables that
    undo it. Use through :func:`applied`."""

    name = "surgery"

    def attach(self, model: nn.Module) -> tuple[int, list[Callable[[], None]]]:
        """Apply to ``model``: (number of sites changed, undo callables)."""
        raise NotImplementedError


class SkipGradient(Surgery):
    """SGM: residual-branch gradients scaled by ``gamma`` (0 < γ ≤ 1; γ = 1 changes nothing)."""

    name = "sgm"

    def __init__(self, gamma: float) -> None:
        if not 0 < gamma <= 1:
            raise UserError(f"sgm: gamma must be in (0, 1], got {gamma}")
        self.gamma = float(gamma)

    def attach(self, model: nn.Module) -> tuple[int, list[Callable[[], None]]]:
        g = self.gamma
        sites = residual_branch_ends(model)
        handles = [m.register_forward_hook(lambda _m, _i, out: scale_grad(out, g)) for _, m in sites]
        return len(sites), [h.remove for h in handles]


class LinearBackward(Surgery):
    """LinBP: the ReLUs registered at or after module ``start`` (a name from
    ``model.named_modules()``) keep their forward value and pass gradients unchanged (as the identity)."""

    name = "linbp"

    def __init__(self, start: str | Callable[[nn.Module], str]) -> None:
        self.start = start

    def attach(self, model: nn.Module) -> tuple[int, list[Callable[[], None]]]:
        start = self.start(model) if callable(self.start) else self.start
        names = [n for n, _ in model.named_modules()]
        if start not in names:
            from ..registry import suggest

            raise UserError("linbp: " + suggest(start, names, "layer"))
        first = names.index(start)
        order = {n: k for k, n in enumerate(names)}
        sites = [(n, m) for n, m in relu_modules(model) if order[n] >= first]
        undo: list[Callable[[], None]] = []
        for _, m in sites:
            was_inplace = m.inplace
            m.inplace = False  # the hook needs the ReLU's input intact

            def hook(_m, inputs, out):
                x = inputs[0]
                return x + (out - x).detach()  # value relu(x), gradient identity

            h = m.register_forward_hook(hook)
            undo += [h.remove, (lambda m=m, v=was_inplace: setattr(m, "inplace", v))]
        return len(sites), undo


def surgery_targets(models: Iterable[nn.Module]) -> list[nn.Module]:
    """The plain networks of surrogate-set members: a collection (LGV, cSGLD: ``members``; SWAG:
    ``workers`` and ``mean_model``) stands for its networks, so layer names are the networks' own."""
    out: list[nn.Module] = []
    for m in models:
        subs = [c for attr in ("members", "workers") for c in getattr(m, attr, [])]
        if isinstance(getattr(m, "mean_model", None), nn.Module):
            subs.append(m.mean_model)
        out.extend(subs or [m])
    return out


@contextmanager
def applied(surgery: Surgery, models: Sequence[nn.Module], require: bool = True) -> Iterator[list[int]]:
    """Apply ``surgery`` to every model for the duration of the ``with`` block; yields the number
    of sites changed per model. With ``require``, a surgery that finds no site in any model is a
    UserError (an SGM on a VGG would silently be MI-FGSM)."""
    undo: list[Callable[[], None]] = []
    counts: list[int] = []
    try:
        for m in surgery_targets(models):
            n, u = surgery.attach(m)
            counts.append(n)
            undo += u
        if require and not any(counts):
            raise UserError(f"{surgery.name}: none of the surrogates has a site it can change "
                            f"(it needs residual blocks for sgm, nn.ReLU modules for linbp)")
        yield counts
    finally:
        for u in reversed(undo):
            u()
