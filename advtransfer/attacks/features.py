"""Intermediate layers of a surrogate, named as the model names them (``model.named_modules()``,
e.g. ``net.layers.4`` for the fifth block of a harness ResNet-20), and taps that read them.

``advtransfer layers MODEL`` prints :func:`list_layers`. A layer spec is a module name, ``auto``
(the middle *block*: the middle of the candidate layers, see :func:`candidate_layers`), or
``penultimate`` (the input of the last linear layer: the representation the classifier reads).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
import torch.nn as nn

from ..core.errors import UserError

#: layer specs that are not module names
SPECIAL_LAYERS = ("auto", "penultimate")


@dataclass
class LayerInfo:
    name: str
    type: str
    shape: tuple[int, ...]   # output shape for one image (C×H×W, or tokens×D)
    candidate: bool          # a block of the model's main chain (what ``auto`` chooses among)


def _main_chain(model: nn.Module) -> tuple[str, nn.Sequential] | None:
    """The ``nn.Sequential`` with the most children: the chain of blocks (``net.layers`` of a
    ResNet, ``net`` of a VGG or MobileNet, ``net.blocks`` of a ViT)."""
    best = None
    for name, m in model.named_modules():
        if isinstance(m, nn.Sequential) and (best is None or len(m) > len(best[1])):
            best = (name, m)
    return best


def list_layers(model: nn.Module, input_shape: Sequence[int] = (3, 32, 32)) -> list[LayerInfo]:
    """Every named module with its output shape on one zero image of ``input_shape``; candidates
    are the main chain's children whose output is a feature map wider than 1×1 (or a token
    sequence)."""
    shapes: dict[str, tuple[int, ...]] = {}
    handles = []

    def keep(name: str):
        def hook(_m, _i, out) -> None:  # returns None: the output is not replaced
            if isinstance(out, torch.Tensor):
                shapes.setdefault(name, tuple(out.shape[1:]))
        return hook

    for name, m in model.named_modules():
        if name:
            handles.append(m.register_forward_hook(keep(name)))
    was_training = model.training
    model.eval()
    try:
        p = next(model.parameters(), None)
        x = torch.zeros(1, *input_shape, device=p.device if p is not None else "cpu",
                        dtype=p.dtype if p is not None and p.dtype.is_floating_point else torch.float32)
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    chain = _main_chain(model)
    cand = set()
    if chain is not None:
        prefix = f"{chain[0]}." if chain[0] else ""
        for k in range(len(chain[1])):
            n = f"{prefix}{k}"
            s = shapes.get(n, ())
            if len(s) == 2 or (len(s) == 3 and s[1] * s[2] > 1):
                cand.add(n)
    return [LayerInfo(n, type(m).__name__, shapes[n], n in cand)
            for n, m in model.named_modules() if n in shapes]


def candidate_layers(model: nn.Module, input_shape: Sequence[int] = (3, 32, 32)) -> list[str]:
    """Names of the model's candidate layers (the blocks of its main chain), in forward order."""
    return [li.name for li in list_layers(model, input_shape) if li.candidate]


def resolve_layer(model: nn.Module, spec: str, input_shape: Sequence[int] = (3, 32, 32),
                  model_name: str = "model") -> str:
    """A module name of ``model`` for the layer ``spec`` (a name, ``auto`` or ``penultimate``)."""
    names = [n for n, _ in model.named_modules() if n]
    if spec == "auto":
        cand = candidate_layers(model, input_shape)
        if not cand:
            raise UserError(f"{model_name} has no block chain for layer 'auto'; name a layer "
                            f"(advtransfer layers {model_name} lists them)")
        return cand[len(cand) // 2]
    if spec == "penultimate":
        linear = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        if not linear:
            raise UserError(f"{model_name} has no linear layer for 'penultimate'")
        return linear[-1]
    if spec not in names:
        from ..core.registry import suggest

        raise UserError(f"{model_name}: " + suggest(spec, names + list(SPECIAL_LAYERS), "layer")
                        + f" (advtransfer layers {model_name} lists them)")
    return spec


class FeatureTap:
    """Reads one layer of a model during its forward passes: ``out`` holds the layer's output (or,
    for ``penultimate``, the input of the last linear layer), with its autograd graph."""

    def __init__(self, model: nn.Module, spec: str, model_name: str = "model",
                 input_shape: Sequence[int] = (3, 32, 32)) -> None:
        self.model = model
        self.spec = spec
        self.layer = resolve_layer(model, spec, input_shape, model_name)
        self.use_input = spec == "penultimate"
        self.out: torch.Tensor | None = None
        self._handle = None

    def __enter__(self) -> "FeatureTap":
        m = dict(self.model.named_modules())[self.layer]
        if self.use_input:
            self._handle = m.register_forward_pre_hook(lambda _m, inp: self._keep(inp[0]))  # returns None
        else:
            self._handle = m.register_forward_hook(lambda _m, _i, out: self._keep(out))  # returns None
        return self

    def _keep(self, t: torch.Tensor) -> None:
        self.out = t

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()
        self._handle = None
        self.out = None

    def features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(features at the layer, logits) of ``x``; inside the ``with`` block."""
        logits = self.model(x)
        assert self.out is not None, f"layer {self.layer} did not run"
        f, self.out = self.out, None
        return f, logits


def check_plain(model: nn.Module, name: str, why: str = "feature-level attacks take plain surrogates") -> None:
    """A feature attack fixes its guides on one network: weight collections are refused with
    ``why`` (what needs a plain surrogate, and what to do) as the start of the line."""
    from .collection import ModelCollection

    if isinstance(model, ModelCollection):
        raise UserError(f"{why}; {name} is a weight collection")


@contextmanager
def taps(models: Sequence[nn.Module], spec: str, names: Sequence[str],
         input_shape: Sequence[int] = (3, 32, 32)) -> Iterator[list[FeatureTap]]:
    """One :class:`FeatureTap` per plain model; collections are refused (a feature attack fixes
    guides on one network, a collection changes network every step)."""
    out = []
    for m, n in zip(models, names):
        check_plain(m, n)
        out.append(FeatureTap(m, spec, n, input_shape))
    entered = []
    try:
        for t in out:
            entered.append(t.__enter__())
        yield out
    finally:
        for t in entered:
            t.__exit__(None, None, None)


class FeatureLevelAttack:
    """Mixin for attacks whose objective lives at an intermediate layer (ILA, FIA, NAA, DTA,
    representation-space): combine with :class:`~advtransfer.attacks.iterative.IterativeAttack`.

    Subclasses give :meth:`prepare` (per-member guides computed once per batch, their gradient
    evaluations counted on the call) and :meth:`feature_objective` (per-sample objective to
    ascend from the layer's features and the logits). The step loop, momentum and projection are
    the iterative family's. Untargeted only; plain (non-collection) surrogates only.
    """

    hooks_model = True  # forward hooks on the model's layers: always crafted on the eager model

    layer_specs: tuple[str, ...] = ()

    def check_untargeted(self) -> None:
        if self.targeted:
            raise UserError(f"attack {self.name!r} is untargeted only (its objective is defined on the "
                            f"true class or without labels); drop targeted: true")

    def layer_spec(self) -> str:
        return str(self.extra["layer"])

    def prepare(self, S, T: list[FeatureTap], x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> list:
        raise NotImplementedError

    def feature_objective(self, i: int, f: torch.Tensor, logits: torch.Tensor, state, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def perturb(self, S, x, y, index):
        """The iterative loop with the call's state (the taps, one per member, and each member's
        guides from :meth:`prepare`), which lives only as long as the call."""
        with taps(S.models, self.layer_spec(), S.names, tuple(x.shape[1:])) as T:
            return self.iterate(S, x, y, index, (T, self.prepare(S, T, x, y, index)))  # type: ignore[attr-defined]

    def gradient(self, S, x_adv: torch.Tensor, y: torch.Tensor, state: tuple[list[FeatureTap], list]) -> torch.Tensor:
        T, guides = state
        xg = x_adv.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            total = 0
            for i, t in enumerate(T):
                f, logits = t.features(xg)
                total = total + S.weights[i].to(xg.dtype) * self.feature_objective(i, f, logits, guides[i], y).sum()
            (g,) = torch.autograd.grad(total, xg)
        S.count(len(S))
        return g.detach()


#: what a feature-importance gradient differentiates: the true class's logit or its probability
SCORES = ("logit", "prob")


def layer_grads(tap: FeatureTap, xs: torch.Tensor, y: torch.Tensor, score: str = "logit") -> torch.Tensor:
    """∂ score_y / ∂ features at the tap's layer for images ``xs``, the score being the true
    class's logit or softmax probability (one backward pass; the caller counts it)."""
    xg = xs.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        f, logits = tap.features(xg)
        s = logits if score == "logit" else torch.softmax(logits, 1)
        (g,) = torch.autograd.grad(s.gather(1, y[:, None]).sum(), f)
    return g.detach()
