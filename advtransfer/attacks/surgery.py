"""Backward-path surgery: a change to how gradients flow through a model, as one object applied to
the surrogate's modules for the length of an attack and removed afterwards (the forward values are
unchanged, so predictions and the cached model are untouched).

- :class:`SkipGradient` (SGM, Wu et al. 2020, ``form: equation``): the gradient through every
  residual branch is multiplied by γ, so ∂z_{i+1}/∂z_i = 1 + γ·∂f_i/∂z_i (the paper's decomposition);
  the skip paths carry the gradient unchanged.
- :class:`SkipGradientAtReLUs` (SGM as the authors' code computes it, ``form: authors``): the
  gradient is scaled at the ReLUs of every residual block except the first block of each stage,
  and normalised by its standard deviation at each block's output (see the class).
- :class:`LinearBackward` (LinBP, Guo et al. 2020, ``form: equation``): every ReLU from a chosen
  layer on passes the gradient as if it were the identity (the forward pass keeps the ReLU).
- :class:`LinearBackwardRenorm` (LinBP as the authors' code computes it, ``form: authors``): inside
  each residual block from the chosen layer on, the branch's ReLUs are linear in the backward pass
  and the branch's input gradient is rescaled to the norm of the true (ReLU) one.

Sites are found by structure: the residual blocks of the harness's ResNets and MobileNets, the
``BasicBlock``/``Bottleneck`` blocks of timm and torchvision ResNets, and timm transformer blocks; ReLUs are ``nn.ReLU`` modules
(the harness's architectures use modules, not ``F.relu``, for this reason), in module-registration
order, which is the forward order of the harness's architectures.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
import torch.nn as nn

from ..core.errors import UserError


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


def _block_parts(m: nn.Module) -> tuple[str, str, str] | None:
    """(kind, branch start attribute, branch end attribute) of a residual block found by structure,
    or None: ``bottleneck`` (``conv1`` … ``bn3``), ``basic`` (``conv1`` … ``bn2``, no ``bn3``: the
    harness's, timm's and torchvision's basic blocks), ``inverted`` (a harness inverted residual:
    ``block`` is the whole branch; ``residual`` says whether it has a skip path)."""
    if hasattr(m, "conv3") and isinstance(getattr(m, "bn3", None), nn.Module):
        return "bottleneck", "conv1", "bn3"
    if hasattr(m, "conv2") and isinstance(getattr(m, "bn2", None), nn.Module) and hasattr(m, "conv1"):
        return "basic", "conv1", "bn2"
    if isinstance(getattr(m, "residual", None), bool) and isinstance(getattr(m, "block", None), nn.Module):
        return "inverted", "block", "block"
    return None


def residual_branch_ends(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) whose output ends a residual branch (the tensor added to the skip path), in
    registration order, found by structure (the attack layer does not import the models): ``bn2``
    of a basic block (harness, timm, torchvision: ``conv2``/``bn2``, no ``bn3``), ``bn3`` of a
    bottleneck, ``block`` of a harness inverted residual that has a skip connection
    (``residual: True``), ``ls1`` and ``ls2`` (the attention and MLP branches) of a timm
    transformer block."""
    out = []
    for name, m in model.named_modules():
        parts = _block_parts(m)
        if parts is not None and (parts[0] != "inverted" or m.residual is True):
            out.append((f"{name}.{parts[2]}", getattr(m, parts[2])))
        elif parts is None and isinstance(getattr(m, "ls1", None), nn.Module) and isinstance(getattr(m, "ls2", None), nn.Module):
            # timm transformer block: x + ls1(attn(norm1(x))), then x + ls2(mlp(norm2(x)))
            out += [(f"{name}.ls1", m.ls1), (f"{name}.ls2", m.ls2)]
    return out


def transformer_branch_ends(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The ``ls1``/``ls2`` entries of :func:`residual_branch_ends` (timm transformer blocks)."""
    return [(n, m) for n, m in residual_branch_ends(model) if n.rsplit(".", 1)[-1] in ("ls1", "ls2")]


@dataclass
class ResidualBlock:
    """A residual block of a CNN found by structure (:func:`residual_blocks`).

    ``branch_start``: the module that reads the block's input on the residual branch (``conv1``, or
    the inverted residual's ``block``); ``branch_end``: the module whose output is added to the skip
    path (``bn2``/``bn3``/``block``); ``skip``: the block has a skip path (an inverted residual
    that changes width or stride has none); ``projection``: the skip path is a convolution
    (``downsample``, ``short``) rather than the identity; ``stage_start``: the first block of a
    stage (see :func:`residual_blocks`); ``branch_relus``: ReLUs on the branch (1 in a basic
    block, 2 in a bottleneck, 1-2 in an inverted residual)."""

    name: str
    module: nn.Module
    branch_start: nn.Module
    branch_end: nn.Module
    skip: bool
    projection: bool
    stage_start: bool
    branch_relus: int


def residual_blocks(model: nn.Module) -> list[ResidualBlock]:
    """The model's CNN residual blocks in registration order (transformer blocks are not included).

    A block starts a stage when its skip path is a projection or absent (it changes width or
    resolution), or when it is the first block among its parent's children (``layer1.0`` of a
    ResNet, ``net.layers.0`` of a harness ResNet-20, the first inverted residual of a MobileNet):
    for torchvision and timm ResNets these are exactly the blocks ``layerK.0`` whose ReLU the SGM
    authors' test ``'0.relu' not in name`` leaves out."""
    out: list[ResidualBlock] = []
    parents_seen: set[str] = set()
    for name, m in model.named_modules():
        parts = _block_parts(m)
        if parts is None:
            continue
        kind, start, end = parts
        if not isinstance(getattr(m, start, None), nn.Module):
            continue
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        first_in_parent = parent not in parents_seen
        parents_seen.add(parent)
        if kind == "inverted":
            skip, projection = bool(m.residual), False
            relus = sum(isinstance(c, nn.ReLU) for c in m.block.modules())
        else:
            shortcut = getattr(m, "downsample", None)
            if shortcut is None:
                shortcut = getattr(m, "short", None)
            skip, projection = True, shortcut is not None
            # torchvision's blocks share one `relu` module that fires on the branch and after the addition
            has_relu = any(isinstance(c, nn.ReLU) for c in m.modules())
            relus = (2 if kind == "bottleneck" else 1) if has_relu else 0
        out.append(ResidualBlock(name, m, getattr(m, start), getattr(m, end), skip, projection,
                                 stage_start=first_in_parent or projection or not skip, branch_relus=relus))
    return out


def _owner(name: str, blocks: Sequence[ResidualBlock]) -> ResidualBlock | None:
    """The innermost block whose module contains the module called ``name``."""
    best = None
    for b in blocks:
        if name.startswith(b.name + ".") or (b.name == "" and name):
            if best is None or len(b.name) > len(best.name):
                best = b
    return best


def per_sample_std(g: torch.Tensor) -> torch.Tensor:
    """Unbiased standard deviation of each sample's entries (``torch.std`` of one sample), shaped
    N×1×…×1, floored at 1e-30 so that an all-zero gradient stays zero."""
    return g.flatten(1).std(dim=1).clamp_min(1e-30).view(-1, *([1] * (g.dim() - 1)))


def _scale_node_hook(s: float):
    """A forward hook registering, on the output's autograd node, a hook that multiplies the
    gradients the node passes back (to its inputs) by ``s``: what the SGM authors'
    ``register_backward_hook`` on an ``nn.ReLU`` does (``return (gamma * grad_in[0],)``)."""
    def node_hook(grad_inputs, _grad_outputs):
        return tuple(None if g is None else g * s for g in grad_inputs)

    def hook(_m, _inputs, out):
        if isinstance(out, torch.Tensor) and out.grad_fn is not None:
            out.grad_fn.register_hook(node_hook)
    return hook


def _std_node_hook(grad_inputs, _grad_outputs):
    """Divide the gradients an autograd node passes back by the per-sample standard deviation of
    the first one (the SGM authors' ``backward_hook_norm``: ``grad_in[0] / torch.std(grad_in[0])``,
    there over the whole batch)."""
    first = next((g for g in grad_inputs if g is not None), None)
    if first is None or first.dim() < 2:
        return None
    std = per_sample_std(first)
    return tuple(g / std if g is not None and g.shape == first.shape else g for g in grad_inputs)


def _std_hook(_m, _inputs, out):
    if isinstance(out, torch.Tensor) and out.grad_fn is not None:
        out.grad_fn.register_hook(_std_node_hook)


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


class _SkipGradientBase(Surgery):
    """What both forms of SGM share: the decay ``gamma`` (0 < γ ≤ 1) and the name."""

    name = "sgm"

    def __init__(self, gamma: float) -> None:
        if not 0 < gamma <= 1:
            raise UserError(f"sgm: gamma must be in (0, 1], got {gamma}")
        self.gamma = float(gamma)


class SkipGradient(_SkipGradientBase):
    """SGM: residual-branch gradients scaled by ``gamma`` (0 < γ ≤ 1; γ = 1 changes nothing)."""

    def attach(self, model: nn.Module) -> tuple[int, list[Callable[[], None]]]:
        g = self.gamma
        sites = residual_branch_ends(model)
        handles = [m.register_forward_hook(lambda _m, _i, out: scale_grad(out, g)) for _, m in sites]
        return len(sites), [h.remove for h in handles]


def _start_layer(model: nn.Module, start: str | Callable[[nn.Module], str]) -> tuple[str, int, dict[str, int]]:
    """LinBP's start layer resolved on ``model``: its name, its position in ``named_modules()`` order,
    and every module name's position (a one-line UserError naming close matches if it is unknown)."""
    name = start(model) if callable(start) else start
    names = [n for n, _ in model.named_modules()]
    if name not in names:
        from ..core.registry import suggest

        raise UserError("linbp: " + suggest(name, names, "layer"))
    return name, names.index(name), {n: k for k, n in enumerate(names)}


class LinearBackward(Surgery):
    """LinBP: the ReLUs registered at or after module ``start`` (a name from
    ``model.named_modules()``) keep their forward value and pass gradients unchanged (as the identity)."""

    name = "linbp"

    def __init__(self, start: str | Callable[[nn.Module], str]) -> None:
        self.start = start

    def attach(self, model: nn.Module) -> tuple[int, list[Callable[[], None]]]:
        _, first, order = _start_layer(model, self.start)
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


class SkipGradientAtReLUs(_SkipGradientBase):
    """SGM as the authors' code computes it (csdongxian/skip-connections-matter ``utils_sgm.py``,
    copied into TransferAttack ``transferattack/model_related/sgm.py``), for ``0 < γ < 1``:

    - ``module.register_backward_hook(backward_hook_sgm)`` on every module with ``'relu' in name
      and not '0.relu' in name``: the gradient each ReLU passes back is multiplied by γ' = γ for
      ResNet-18/34 and √γ for ResNet-50/101/152 (``gamma = np.power(gamma, 0.5)``), i.e. γ over the
      ReLUs of a residual branch. Here: every ``nn.ReLU`` except those inside the first block of
      a stage (:func:`residual_blocks`; the authors' ``'0.relu'`` test) is scaled by γ^(1/k), k the
      ReLUs on its block's branch (1 basic, 2 bottleneck, 1-2 inverted residual; outside blocks:
      k of the decayed blocks, as the authors scale the stem's ``relu`` by their γ'). In a
      torchvision basic block the one ``relu`` module also fires after the addition, so that firing
      is scaled too, as in the authors' code (the standard deviation normalisation below cancels it).
    - ``module.register_backward_hook(backward_hook_norm)`` on every block (``'layer' in
      name.split('.')[-2]``): the gradient the block's last operation passes back (the ReLU after
      the addition) is divided by its standard deviation. The authors take ``torch.std`` over the
      whole batch; here it is per sample (batch independence), identical for a batch of one.

    The hooks sit where the authors' ``register_backward_hook`` puts them: on the autograd node of
    the module's output, in the same order. For a batch of one the input gradient is the
    authors' to float rounding; for a batch, each image's gradient is what the authors' code
    gives that image alone. Both normalisations multiply an image's whole input gradient by a
    positive number, so sign steps and MI-FGSM's L1-normalised momentum do not see them.
    Departure from the authors' string test: ``'0.relu' not in name`` also leaves out blocks 10,
    20, 30 of a stage with more than ten blocks (ResNet-101/152's ``layer3``); here only the first
    block of a stage is left out. A block whose branch has no ReLU (and a timm transformer
    block, which the authors' code does not support) gets the paper's branch decay by γ instead.
    γ = 1 changes nothing (the authors register no hook: ``if args.gamma < 1.0``)."""

    def attach(self, model: nn.Module) -> tuple[int, list[Callable[[], None]]]:
        g = self.gamma
        blocks = residual_blocks(model)
        decayed = [b for b in blocks if not b.stage_start]
        transformer = transformer_branch_ends(model)
        n_sites = len(decayed) + len(transformer)
        if g == 1.0:
            return n_sites, []
        handles = []
        with_relus = [b for b in decayed if b.branch_relus > 0]
        k_model = with_relus[0].branch_relus if with_relus else 1
        for name, r in relu_modules(model):
            owner = _owner(name, blocks)
            if owner is not None and owner.stage_start:
                continue  # the first block of a stage: the authors' `'0.relu' not in name`
            k = owner.branch_relus if owner is not None else k_model
            handles.append(r.register_forward_hook(_scale_node_hook(g ** (1.0 / k))))
        for b in decayed:
            if b.branch_relus == 0:  # no ReLU to carry the decay: the paper's branch decay
                handles.append(b.branch_end.register_forward_hook(lambda _m, _i, out: scale_grad(out, g)))
        for b in blocks:
            handles.append(b.module.register_forward_hook(_std_hook))
        for _, m in transformer:
            handles.append(m.register_forward_hook(lambda _m, _i, out: scale_grad(out, g)))
        return n_sites, [h.remove for h in handles]


class _BranchState:
    """What LinBP's hooks share within one residual block during a forward pass."""

    def __init__(self) -> None:
        self.inside = False      # between the branch's first module and its end
        self.linear = True       # mode of the branch's ReLUs in the backward pass
        self.x: torch.Tensor | None = None      # the block input (the skip path reads it)
        self.leaf: torch.Tensor | None = None   # a detached copy the branch reads instead


class _SwitchRelu(torch.autograd.Function):
    """Value: the ReLU's output; backward: the identity (``state.linear``) or the ReLU's own mask
    (the authors' ``linbp_relu`` and ``ori_mask = out.data.bool()``)."""

    @staticmethod
    def forward(ctx, pre: torch.Tensor, post: torch.Tensor, state: _BranchState) -> torch.Tensor:  # type: ignore[override]
        ctx.state, ctx.mask = state, post > 0
        return post.clone()

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        return (g if ctx.state.linear else g * ctx.mask.to(g.dtype)), None, None


class _RenormBranch(torch.autograd.Function):
    """Value: the branch output ``b``; backward: the gradient reaching the block input ``x`` through
    the branch is the linear one rescaled, per sample, to the L2 norm of the true one (the
    authors' ``alpha = normal_grad_0.norm(p=2, dim=(1,2,3)) / main_grad.norm(p=2, dim=(1,2,3))``,
    ``main_grad_norm = xp * alpha * main_grad`` with ``xp = sgm_lambda = 1``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, b_value: torch.Tensor, extra: tuple) -> torch.Tensor:  # type: ignore[override]
        ctx.extra = extra
        return b_value.clone()

    @staticmethod
    def backward(ctx, u: torch.Tensor):  # type: ignore[override]
        b, leaf, state = ctx.extra
        ctx.extra = None
        with torch.enable_grad():
            state.linear = False
            (true,) = torch.autograd.grad(b, leaf, u, retain_graph=True, allow_unused=True)
            state.linear = True
            (lin,) = torch.autograd.grad(b, leaf, u, allow_unused=True)
        if lin is None or true is None:
            return None, None, None
        n_true = true.flatten(1).norm(p=2, dim=1)
        n_lin = lin.flatten(1).norm(p=2, dim=1).clamp_min(1e-30)
        alpha = (n_true / n_lin).view(-1, *([1] * (lin.dim() - 1)))
        return alpha * lin, None, None


class LinearBackwardRenorm(Surgery):
    """LinBP as the authors' code computes it (qizhangli/linbp-attack ``attack/imagenet/utils.py``
    ``linbp_forw_resnet50``/``block_func``/``linbp_backw_resnet50``, the same in TransferAttack
    ``transferattack/model_related/linbp.py``): for every residual block at or after module
    ``start`` (and the block that contains ``start``):

    - the ReLUs on the residual branch keep their forward value and are linear in the backward
      pass (``linbp_relu``: ``x + F.relu(-x).data``);
    - the ReLU after the addition keeps its true derivative (``block_func`` calls ``block.relu``);
    - the gradient the branch passes to the block input is rescaled, per sample, to the L2 norm
      of the gradient the branch would pass with its true ReLUs (``normal_grad_0``, through the
      masks ``ori_mask_ls``), times ``sgm_lambda`` = 1 (the script's default): ``main_grad_norm =
      xp * alpha * main_grad``; the skip path (identity or ``downsample``) is unchanged.

    ReLUs at or after ``start`` that are in no residual block (a VGG's, a MobileNet's head), or in a
    block without a skip path, are linear without renormalisation, as the authors' VGG-19 code
    (``attack/cifar10/utils.py`` ``vgg19_forw``: ``linbp_relu`` for every ReLU from
    ``linbp_layer`` on). Blocks before ``start`` and everything before it keep their true gradient.
    The renormalisation is per sample as in the authors' code. Implementation: the branch reads a
    detached copy of the block input; its two backward passes (true masks, then linear) are taken
    inside the backward pass of the block's output, and only the rescaled linear one reaches the
    block input."""

    name = "linbp"

    def __init__(self, start: str | Callable[[nn.Module], str]) -> None:
        self.start = start

    def attach(self, model: nn.Module) -> tuple[int, list[Callable[[], None]]]:
        start, first, order = _start_layer(model, self.start)
        blocks = [b for b in residual_blocks(model) if b.skip]
        in_scope = [b for b in blocks if order[b.name] >= first or start.startswith(b.name + ".")]
        handles: list[Any] = []
        undo: list[Callable[[], None]] = []
        states = {b.name: _BranchState() for b in in_scope}

        def no_inplace(m: nn.Module) -> None:
            was = m.inplace
            m.inplace = False  # the hooks need the ReLU's input intact
            undo.append(lambda m=m, v=was: setattr(m, "inplace", v))

        for b in in_scope:
            st = states[b.name]

            def pre(_m, args, st=st):
                x = args[0]
                if not (torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad):
                    return None
                leaf = x.detach().requires_grad_(True)
                st.x, st.leaf, st.inside = x, leaf, True
                return (leaf, *args[1:])

            def end(_m, _args, out, st=st):
                if not st.inside:
                    return None
                st.inside = False
                x, leaf = st.x, st.leaf
                st.x = st.leaf = None
                return _RenormBranch.apply(x, out.detach(), (out, leaf, st))

            handles.append(b.branch_start.register_forward_pre_hook(pre))
            handles.append(b.branch_end.register_forward_hook(end))
        n_plain = 0
        for name, r in relu_modules(model):
            owner = _owner(name, blocks)
            if owner is not None and owner.name in states:
                st = states[owner.name]

                def switch(_m, inputs, out, st=st):
                    return _SwitchRelu.apply(inputs[0], out.detach(), st) if st.inside else None

                no_inplace(r)
                handles.append(r.register_forward_hook(switch))
            elif owner is None and order[name] >= first:  # outside residual blocks: the authors' VGG rule
                no_inplace(r)
                handles.append(r.register_forward_hook(_linear_relu_hook))
                n_plain += 1
        return len(in_scope) + n_plain, [h.remove for h in handles] + undo


def _linear_relu_hook(_m, inputs, out):
    x = inputs[0]
    return x + (out - x).detach()  # value relu(x), gradient identity


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


def check_sites(attack: Any, cell: Any) -> None:
    """A UserError when ``attack``'s backward-path surgery (``attack.surgery(shape)``) would change
    no site in any network of ``cell`` (a :class:`~advtransfer.attacks.params.CellView`): an SGM
    with nothing to decay would be plain MI-FGSM, and the crafting would fail only after the cells
    before it had run. Members the preflight could not build (None) are not judged; a cell with
    any such member passes (its network is checked when crafted)."""
    nets = [n for _, n in cell.networks]
    if not nets or any(n is None for n in nets):
        return
    surgery = attack.surgery(tuple(cell.image_shape))
    counts = []
    for target in surgery_targets(nets):
        n, undo = surgery.attach(target)
        counts.append(n)
        for u in reversed(undo):
            u()
    if not any(counts):
        archs = dict(cell.archs)
        models = ", ".join(f"{m} ({archs.get(m, '?')})" for m, _ in cell.networks)
        raise UserError(f"{attack.name} finds no site to change in {models} at size {cell.size} (sgm needs "
                        f"residual blocks, linbp nn.ReLU modules); leave it out of that surrogate's attacks "
                        f"(at one size: sizes: {{{cell.size}: {{attacks: [...]}}}})")


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
