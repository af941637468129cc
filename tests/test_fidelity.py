"""Fidelity to the authors' code: SGM, LinBP and BSR compute what their authors' public code
computes, checked against references written here from that code's lines.

- SGM: csdongxian/skip-connections-matter ``utils_sgm.py`` (copied into TransferAttack's
  ``model_related/sgm.py``): its ``register_hook_for_resnet`` is reproduced below line by line
  and registered on the same modules; the harness's input gradient must equal the hooked
  model's to float rounding (for one image; for a batch, each image's gradient equals what the
  hooks give that image alone, since the harness normalises per sample).
- LinBP: qizhangli/linbp-attack ``attack/imagenet/utils.py`` (``block_func``, ``linbp_relu``,
  ``linbp_backw_resnet50``), reproduced below for basic blocks (the ResNet-50 code's two branch
  ReLUs become the basic block's one): the re-normalisation of the linear branch gradient to the
  true one's norm at every block.
- BSR: TransferAttack ``input_transformation/bsr.py`` (``get_length``, ``shuffle``,
  ``image_rotation`` with torchvision's ``RandomRotation``), reproduced below with its random
  draws replaced by fixed ones.
- The earlier forms (``form: equation``, ``form: v1``) reproduce the version-1 outputs bit for bit;
  PAS's plain path is MI-FGSM and its SGM point SGM's equation form; on a trained ci ResNet-20 the
  authors' forms recover the white-box success the version-1 forms lost.

The models: a torchvision ResNet-18 (random init, fixed seed, non-trivial BatchNorm statistics,
float64) inside the harness's :class:`ImageClassifier`, as the harness wraps its models; a timm
ResNet-18 carrying the same weights; and a torchvision-shaped view of the harness's own ResNet-20
(the same modules arranged as ``layer1..3`` of torchvision ``BasicBlock``-like blocks with one
shared ``relu``), so the authors' name-based rules apply to it unchanged.
"""
from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from advtransfer.attacks import SurrogateSet, create_attack
from advtransfer.attacks.surgery import SkipGradient, applied, residual_blocks, scale_grad
from advtransfer.attacks.transforms import (BlockShuffleRotation, BSRDraw, _split_lengths, apply_bsr,
                                            authors_draw_lengths, authors_lengths, draw_bsr, rotate_bilinear)
from advtransfer.models.archs import ImageClassifier, build_arch

torchvision = pytest.importorskip("torchvision")


# --- models ---------------------------------------------------------------------------------------

def _randomise_bn(net: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                m.weight.copy_(1 + 0.2 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
    return net


def _tv_resnet18(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return ImageClassifier(_randomise_bn(torchvision.models.resnet18(num_classes=10), seed)).double().eval()


class _TVBlock(nn.Module):
    """A harness basic block seen as torchvision's ``BasicBlock``: the same convolutions and
    BatchNorms, one ``relu`` module used on the branch and after the addition, ``downsample``."""

    def __init__(self, b: nn.Module) -> None:
        super().__init__()
        self.conv1, self.bn1, self.conv2, self.bn2, self.downsample = b.conv1, b.bn1, b.conv2, b.bn2, b.short
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class _TVResNet20(nn.Module):
    """The harness's ResNet-20 (``model.net``) arranged as a torchvision ResNet: ``conv1``, ``bn1``,
    ``relu``, ``layer1..3`` of three blocks, ``fc``; normalisation inside, as ImageClassifier."""

    def __init__(self, model: ImageClassifier) -> None:
        super().__init__()
        net = model.net
        self.mean, self.std = model.mean, model.std
        self.conv1, self.bn1, self.relu = net.stem[0], net.stem[1], nn.ReLU(inplace=True)
        blocks = [_TVBlock(b) for b in net.layers]
        self.layer1, self.layer2, self.layer3 = (nn.Sequential(*blocks[3 * k:3 * k + 3]) for k in range(3))
        self.fc = net.fc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1((x - self.mean) / self.std)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    def stages(self) -> list[nn.Sequential]:
        return [self.layer1, self.layer2, self.layer3]


def _harness_resnet20(seed: int = 0) -> ImageClassifier:
    torch.manual_seed(seed)
    return ImageClassifier(_randomise_bn(build_arch("resnet", depth=20), seed)).double().eval()


@pytest.fixture(scope="module")
def images():
    g = torch.Generator().manual_seed(7)
    return torch.rand(4, 3, 32, 32, generator=g, dtype=torch.float64), torch.tensor([1, 4, 7, 9])


def _grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Input gradient of the summed cross-entropy (for one image: the authors' mean)."""
    xg = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(F.cross_entropy(model(xg), y, reduction="sum"), xg)
    return g


def _unit(g: torch.Tensor) -> torch.Tensor:
    return g / g.flatten(1).norm(dim=1).view(-1, 1, 1, 1)


# --- SGM ------------------------------------------------------------------------------------------

def _authors_sgm_hooks(model: nn.Module, arch: str, gamma: float) -> list:
    """``register_hook_for_resnet`` of skip-connections-matter's ``utils_sgm.py``, line by line
    (``backward_hook``, ``backward_hook_norm``), on ``model``'s modules; returns the handles."""
    if arch in ["resnet50", "resnet101", "resnet152"]:
        gamma = np.power(gamma, 0.5)

    def backward_hook_sgm(module, grad_in, grad_out):
        if isinstance(module, nn.ReLU):
            return (gamma * grad_in[0],)

    def backward_hook_norm(module, grad_in, grad_out):
        std = torch.std(grad_in[0])
        return (grad_in[0] / std,)

    handles = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # register_backward_hook is deprecated; the authors use it
        for name, module in model.named_modules():
            if "relu" in name and "0.relu" not in name:
                handles.append(module.register_backward_hook(backward_hook_sgm))
            if len(name.split(".")) >= 2 and "layer" in name.split(".")[-2]:
                handles.append(module.register_backward_hook(backward_hook_norm))
    return handles


def _sgm_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor, **params) -> tuple[torch.Tensor, list[int]]:
    atk = create_attack("sgm", **params)
    with applied(atk.surgery(), [model]) as counts:
        return SurrogateSet(model).bind().grad(x, y), counts


def _authors_sgm_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor, gamma: float) -> torch.Tensor:
    """The hooked copy's gradient, one image at a time (the authors' std is over the batch)."""
    ref = copy.deepcopy(model)
    _authors_sgm_hooks(ref, "resnet18", gamma)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.cat([_grad(ref, x[i:i + 1], y[i:i + 1]) for i in range(len(x))])


def test_sgm_gradient_is_the_authors_hooks_on_torchvision_resnet18(images):
    model, (x, y) = _tv_resnet18(), images
    ref = _authors_sgm_grad(model, x, y, 0.2)
    for i in range(len(x)):  # one image: the authors' batch std is the harness's per-sample std
        g1, counts = _sgm_grad(model, x[i:i + 1], y[i:i + 1], gamma=0.2)
        torch.testing.assert_close(g1, ref[i:i + 1], rtol=1e-10, atol=1e-13)
    # layer1.1 .. layer4.1: the blocks whose ReLU passes `'0.relu' not in name`
    assert counts == [4]
    g, _ = _sgm_grad(model, x, y, gamma=0.2)  # a batch: each image as if alone
    torch.testing.assert_close(g, ref, rtol=1e-9, atol=1e-13)
    # the test can fail: the plain gradient and the equation form (every block decayed) differ
    plain = SurrogateSet(model).bind().grad(x, y)
    eq, counts_eq = _sgm_grad(model, x, y, gamma=0.2, form="equation")
    assert counts_eq == [8]
    for other in (plain, eq):
        assert float((_unit(g) - _unit(other)).abs().max()) > 1e-3
    # γ = 1: no hook at all (the authors' `if gamma < 1.0`), the plain gradient exactly
    torch.testing.assert_close(_sgm_grad(model, x, y, gamma=1.0)[0], plain, rtol=0, atol=0)


def test_sgm_attack_agrees_with_torchattacks_port(images):
    """torchattack's SGM registers the authors' hooks (``'0.relu' not in name``, ``backward_hook_norm``)
    on a torchvision ResNet: ten MI-FGSM steps give the same examples as the harness's SGM (the
    batch-wide std there, per image here, rescales each image's gradient by a positive number)."""
    torchattack = pytest.importorskip("torchattack")
    model, (x, y) = _tv_resnet18(1), images
    eps, steps = 8 / 255, 10
    ours = create_attack("sgm", eps=eps, steps=steps, gamma=0.2)(SurrogateSet(model), x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torchattack.SGM(copy.deepcopy(model), device=torch.device("cpu"), hook_cfg="resnet18", eps=eps,
                                 steps=steps, alpha=eps / steps, decay=1.0, gamma=0.2)(x, y).detach()
    frac = float(((ours - theirs).abs() > 1e-6).float().mean())
    assert frac <= 1e-3, f"{frac:.2%} of pixels differ from torchattack's SGM"
    eq = create_attack("sgm", eps=eps, steps=steps, gamma=0.2, form="equation")(SurrogateSet(model), x, y)
    assert float(((eq - theirs).abs() > 1e-6).float().mean()) > 0.01  # the comparison tells the forms apart


def test_sgm_matches_the_authors_rule_on_the_harness_resnet20_and_timm(images):
    """The harness's ResNet-20 seen as a torchvision ResNet (the authors' names apply) and a timm
    ResNet-18 with the torchvision model's weights (act1/act2 modules instead of one shared
    relu): the harness's SGM on the original equals the authors' hooks on the view."""
    x, y = images
    model = _harness_resnet20()
    view = _TVResNet20(model).eval()
    torch.testing.assert_close(view(x), model(x), rtol=0, atol=0)  # the same function
    ref = _authors_sgm_grad(view, x, y, 0.2)
    g, counts = _sgm_grad(model, x, y, gamma=0.2)
    assert counts == [6]  # net.layers.1, 2, 4, 5, 7, 8: not net.layers.0/3/6, the first of each stage
    assert [b.name for b in residual_blocks(model) if b.stage_start] == [f"net.layers.{k}" for k in (0, 3, 6)]
    torch.testing.assert_close(g, ref, rtol=1e-9, atol=1e-13)

    timm = pytest.importorskip("timm")
    tv = _tv_resnet18()
    tm = timm.create_model("resnet18", pretrained=False, num_classes=10)
    tm.load_state_dict(tv.net.state_dict())
    tm = ImageClassifier(tm).double().eval()
    torch.testing.assert_close(tm(x), tv(x), rtol=1e-10, atol=1e-12)
    g_tm, counts_tm = _sgm_grad(tm, x, y, gamma=0.2)
    assert counts_tm == [4]
    torch.testing.assert_close(g_tm, _authors_sgm_grad(tv, x, y, 0.2), rtol=1e-9, atol=1e-13)


def test_sgm_on_the_harness_mobilenet_decays_the_later_residual_branches(images):
    """No authors' code covers MobileNets. The harness's inverted residuals carry two ReLUs on
    their branch, each scaled by √γ: the input gradient is, up to a positive factor per image,
    the paper's branch decay by γ applied to the residual blocks that are not the first of their
    stage (the first block of the net; blocks that change width or stride have no skip path)."""
    x, y = images
    torch.manual_seed(1)
    model = ImageClassifier(_randomise_bn(build_arch("mobilenet", width=8), 1)).double().eval()
    blocks = residual_blocks(model)
    decayed = [b for b in blocks if not b.stage_start]
    assert decayed and all(b.skip and b.branch_relus == 2 for b in decayed)
    assert blocks[0].skip and blocks[0].stage_start  # the first inverted residual keeps width and stride
    g, counts = _sgm_grad(model, x, y, gamma=0.3)
    assert counts == [len(decayed)]
    handles = [b.branch_end.register_forward_hook(lambda _m, _i, out: scale_grad(out, 0.3)) for b in decayed]
    try:
        ref = _grad(model, x, y)
    finally:
        for h in handles:
            h.remove()
    torch.testing.assert_close(_unit(g), _unit(ref), rtol=1e-8, atol=1e-11)
    assert float((_unit(g) - _unit(_grad(model, x, y))).abs().max()) > 1e-3


# --- LinBP ----------------------------------------------------------------------------------------

def _linbp_relu(x: torch.Tensor) -> torch.Tensor:
    x_p = F.relu(-x)
    return x + x_p.data


def _block_func(block: nn.Module, x: torch.Tensor, linbp: bool):
    """The authors' ``block_func`` for a basic block (one branch ReLU)."""
    identity = x
    conv_in = x + 0
    out = block.bn1(block.conv1(conv_in))
    out_0 = out + 0
    out = _linbp_relu(out_0) if linbp else block.relu(out_0)
    ori_mask_0 = out.data.bool().int()
    out = block.bn2(block.conv2(out))
    if block.downsample is not None:
        identity = block.downsample(identity)
    identity_out = identity + 0
    x_out = out + 0
    out = identity_out + x_out
    out = block.relu(out)
    ori_mask_2 = out.data.bool().int()
    return out, (ori_mask_0, ori_mask_2), (identity_out, x_out), (out_0,), (0, conv_in)


def _authors_linbp_grad(stem, stages: list[nn.Sequential], head, x: torch.Tensor, y: torch.Tensor,
                        start: tuple[int, int], xp: float = 1.0) -> torch.Tensor:
    """``linbp_forw_resnet50`` (blocks from stage ``start[0]``, index ``start[1]`` on run
    ``block_func(linbp=True)``) and ``linbp_backw_resnet50`` with the basic block's one mask."""
    img = x.clone().requires_grad_(True)
    h = stem(img)
    ori_mask_ls, conv_out_ls, relu_out_ls, conv_input_ls = [], [], [], []
    on = False
    for jj, layer in enumerate(stages, 1):
        for kk, mm in enumerate(layer):
            on = on or (jj, kk) == start
            h, ori_mask, conv_out, relu_out, conv_in = _block_func(mm, h, linbp=on)
            if on:
                ori_mask_ls.append(ori_mask)
                conv_out_ls.append(conv_out)
                relu_out_ls.append(relu_out)
                conv_input_ls.append(conv_in)
    loss = F.cross_entropy(head(h), y, reduction="sum")
    for i in range(-1, -len(conv_out_ls) - 1, -1):
        if i == -1:
            grads = torch.autograd.grad(loss, conv_out_ls[i])
        else:
            grads = torch.autograd.grad((conv_out_ls[i + 1][0], conv_input_ls[i + 1][1]), conv_out_ls[i],
                                        grad_outputs=(grads[0], main_grad_norm))
        normal_grad_1 = torch.autograd.grad(conv_out_ls[i][1], relu_out_ls[i][0], grads[1] * ori_mask_ls[i][1],
                                            retain_graph=True)[0]
        normal_grad_0 = torch.autograd.grad(relu_out_ls[i][0], conv_input_ls[i][1], normal_grad_1 * ori_mask_ls[i][0],
                                            retain_graph=True)[0]
        main_grad = torch.autograd.grad(conv_out_ls[i][1], conv_input_ls[i][1], grads[1])[0]
        alpha = normal_grad_0.norm(p=2, dim=(1, 2, 3), keepdim=True) / main_grad.norm(p=2, dim=(1, 2, 3), keepdim=True)
        main_grad_norm = xp * alpha * main_grad
    return torch.autograd.grad((conv_out_ls[0][0], conv_input_ls[0][1]), img, grad_outputs=(grads[0], main_grad_norm))[0]


def _linbp_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor, **params) -> tuple[torch.Tensor, list[int]]:
    atk = create_attack("linbp", **params)
    with applied(atk.surgery(tuple(x.shape[1:])), [model]) as counts:
        return SurrogateSet(model).bind().grad(x, y), counts


def test_linbp_gradient_is_the_authors_renormalised_backward_on_torchvision_resnet18(images):
    model, (x, y) = _tv_resnet18(), images
    net = model.net
    stem = lambda v: net.maxpool(net.relu(net.bn1(net.conv1((v - model.mean) / model.std))))
    head = lambda h: net.fc(torch.flatten(net.avgpool(h), 1))
    stages = [net.layer1, net.layer2, net.layer3, net.layer4]
    ref = _authors_linbp_grad(stem, stages, head, x, y, start=(2, 1))
    g, counts = _linbp_grad(model, x, y, layer="net.layer2.1")
    assert counts == [5]  # layer2.1, layer3.0, layer3.1, layer4.0, layer4.1
    torch.testing.assert_close(g, ref, rtol=1e-9, atol=1e-13)
    # the re-normalisation matters: plain linear backpropagation (version 1) and the true gradient differ
    eq, _ = _linbp_grad(model, x, y, layer="net.layer2.1", form="equation")
    plain = SurrogateSet(model).bind().grad(x, y)
    for other in (eq, plain):
        assert float((_unit(g) - _unit(other)).abs().max()) > 1e-3
    with applied(create_attack("linbp", layer="net.layer2.1").surgery((3, 32, 32)), [model]):
        torch.testing.assert_close(model(x), _tv_resnet18()(x), rtol=0, atol=0)  # forward untouched


def test_linbp_matches_the_authors_on_the_harness_resnet20_and_timm(images):
    x, y = images
    model = _harness_resnet20(2)
    view = _TVResNet20(model).eval()
    stem = lambda v: view.relu(view.bn1(view.conv1((v - view.mean) / view.std)))
    head = lambda h: view.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))
    ref = _authors_linbp_grad(stem, view.stages(), head, x, y, start=(2, 1))  # net.layers.4: `auto`
    g, counts = _linbp_grad(model, x, y)
    assert counts == [5]
    torch.testing.assert_close(g, ref, rtol=1e-9, atol=1e-13)

    timm = pytest.importorskip("timm")
    tv = _tv_resnet18(3)
    tm = timm.create_model("resnet18", pretrained=False, num_classes=10)
    tm.load_state_dict(tv.net.state_dict())
    tm = ImageClassifier(tm).double().eval()
    g_tm, _ = _linbp_grad(tm, x, y, layer="net.layer3.0")
    g_tv, _ = _linbp_grad(tv, x, y, layer="net.layer3.0")
    torch.testing.assert_close(g_tm, g_tv, rtol=1e-9, atol=1e-13)


def test_linbp_without_residual_blocks_linearises_every_relu_from_the_layer(images):
    """The authors' VGG-19 code: every ReLU from ``linbp_layer`` on is ``linbp_relu``, no
    re-normalisation; both forms then coincide."""
    x, y = images
    torch.manual_seed(4)
    vgg = ImageClassifier(_randomise_bn(build_arch("vgg"), 4)).double().eval()
    a, counts = _linbp_grad(vgg, x, y, layer="net.3")
    e, _ = _linbp_grad(vgg, x, y, layer="net.3", form="equation")
    assert counts == [3]
    torch.testing.assert_close(a, e, rtol=0, atol=0)
    assert float((_unit(a) - _unit(SurrogateSet(vgg).bind().grad(x, y))).abs().max()) > 1e-3


def test_linbp_on_the_harness_mobilenet_renormalises_each_residual_branch(images):
    """No authors' code covers MobileNets. From ``layer`` on, each inverted residual with a skip
    path gets the renormalised linear branch (its input gradient through the branch has the norm
    of the true one), the other ReLUs (blocks without a skip path, the head) are linear; the
    forward pass is untouched and the surgery is removed afterwards."""
    x, y = images
    torch.manual_seed(2)
    model = ImageClassifier(_randomise_bn(build_arch("mobilenet", width=8), 2)).double().eval()
    before, plain = model(x), _grad(model, x, y)
    blocks = [b for b in residual_blocks(model) if b.skip]
    layer = blocks[1].name  # from the second residual block on
    atk = create_attack("linbp", layer=layer)
    with applied(atk.surgery((3, 32, 32)), [model]) as counts:
        torch.testing.assert_close(model(x), before, rtol=0, atol=0)
        g = SurrogateSet(model).bind().grad(x, y)
        # one block's branch, probed on its own: the gradient it passes to the block input has the
        # norm of the true (ReLU) branch's, along the linear branch's direction
        b = blocks[-1]
        seen = {}
        h = b.module.register_forward_pre_hook(lambda _m, a: seen.setdefault("x", a[0]))
        h2 = b.branch_end.register_forward_hook(lambda _m, _a, out: seen.setdefault("b", out))
        xg = x.clone().requires_grad_(True)
        model(xg)
        h.remove(), h2.remove()
        u = torch.randn(seen["b"].shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        (through,) = torch.autograd.grad(seen["b"], seen["x"], u)
    names = [n for n, _ in model.named_modules()]
    plain_relus = [n for n, m in model.named_modules() if isinstance(m, nn.ReLU) and names.index(n) > names.index(layer)
                   and not any(n.startswith(b.name + ".") for b in blocks)]
    assert plain_relus and counts == [len(blocks) - 1 + len(plain_relus)]  # renormalised blocks + linear ReLUs
    torch.testing.assert_close(model(x), before, rtol=0, atol=0)
    torch.testing.assert_close(_grad(model, x, y), plain, rtol=0, atol=0)  # removed
    branch = copy.deepcopy(b.module.block)
    xb = seen["x"].detach().clone().requires_grad_(True)
    (true,) = torch.autograd.grad(branch(xb), xb, u)
    lin_branch = copy.deepcopy(branch)
    for m in lin_branch.modules():
        if isinstance(m, nn.ReLU):
            m.register_forward_hook(lambda _m, inp, out: inp[0] + (out - inp[0]).detach())
            m.inplace = False
    (lin,) = torch.autograd.grad(lin_branch(xb), xb, u)
    expect = lin * (true.flatten(1).norm(dim=1) / lin.flatten(1).norm(dim=1)).view(-1, 1, 1, 1)
    torch.testing.assert_close(through, expect, rtol=1e-9, atol=1e-13)
    assert float((_unit(g) - _unit(plain)).abs().max()) > 1e-3


# --- BSR ------------------------------------------------------------------------------------------

def _ta_get_length(rand: np.ndarray, length: int) -> tuple:
    """TransferAttack's ``BSR.get_length`` after its draw ``rand = np.random.uniform(2, size=num_block)``."""
    rand_norm = np.round(rand / rand.sum() * length).astype(np.int32)
    rand_norm[rand_norm.argmax()] += length - rand_norm.sum()
    return tuple(rand_norm)


def _ta_shuffle(x: torch.Tensor, d: BSRDraw) -> torch.Tensor:
    """TransferAttack's ``BSR.shuffle`` with its draws fixed by ``d``: ``random.shuffle(dims)`` ->
    ``d.first``; ``get_length`` -> ``d.lengths`` / ``d.piece_lengths``; ``random.shuffle(x_strips)``
    -> ``d.order`` / ``d.piece_orders``; ``T.RandomRotation(degrees=(-24, 24), BILINEAR)`` with its
    angle pinned to ``d.angles[k]``."""
    import torchvision.transforms as T

    dims = [d.first, 5 - d.first]
    x_strips = list(x.split(tuple(d.lengths), dim=dims[0]))
    x_strips = [x_strips[i] for i in d.order]
    out = []
    for k, x_strip in enumerate(x_strips):
        rotated = T.RandomRotation(degrees=(d.angles[k], d.angles[k]), interpolation=T.InterpolationMode.BILINEAR)(x_strip)
        pieces = list(rotated.split(tuple(d.piece_lengths[k]), dim=dims[1]))
        out.append(torch.cat([pieces[i] for i in d.piece_orders[k]], dim=dims[1]))
    return torch.cat(out, dim=dims[0])


def test_bsr_rotation_is_torchvisions_bilinear_random_rotation():
    import torchvision.transforms as T

    g = torch.Generator().manual_seed(0)
    for shape, angle in (((1, 3, 32, 32), 17.5), ((1, 3, 11, 32), -23.0), ((2, 3, 32, 7), 9.25), ((1, 3, 13, 21), 0.0)):
        x = torch.rand(shape, generator=g, dtype=torch.float64, requires_grad=True)
        ours = rotate_bilinear(x, angle)
        ref = T.RandomRotation(degrees=(angle, angle), interpolation=T.InterpolationMode.BILINEAR)(x)
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
        w = torch.rand(shape, generator=g, dtype=torch.float64)
        torch.testing.assert_close(torch.autograd.grad((ours * w).sum(), x)[0],
                                   torch.autograd.grad((ref * w).sum(), x)[0], rtol=0, atol=1e-12)
    x = torch.rand(1, 3, 11, 32, generator=g, dtype=torch.float64)
    assert float((rotate_bilinear(x, 20.0) - rotate_bilinear(x, -20.0)).abs().max()) > 0.05  # the sign matters


def test_bsr_block_lengths_are_transferattacks():
    rng = np.random.default_rng(0)
    for n in (2, 3, 4):
        for length in (32, 11, 29):
            for _ in range(200):
                rand = 2 + (1 - 2) * rng.random(n)  # np.random.uniform(2, size=n): low 2, high 1
                assert tuple(authors_lengths(torch.from_numpy(rand), length)) == _ta_get_length(rand, length)
    # the draws: uniform on (1, 2], so a 2-way split of 32 px is 11..21 px and a 3-way one 6..16 px
    g = torch.Generator().manual_seed(0)
    two = [authors_draw_lengths(32, 2, g) for _ in range(2000)]
    three = [authors_draw_lengths(32, 3, g) for _ in range(2000)]
    assert min(min(v) for v in two) == 11 and max(max(v) for v in two) == 21
    assert min(min(v) for v in three) >= 6 and max(max(v) for v in three) <= 16
    assert all(sum(v) == 32 for v in two + three)
    # version 1's U(0,1) proportions give far thinner strips: the check above tells them apart
    assert min(min(_split_lengths(32, 2, g)) for _ in range(2000)) < 6


@pytest.mark.parametrize("blocks", [2, 3])
def test_bsr_transform_with_fixed_draws_is_transferattacks(blocks):
    g = torch.Generator().manual_seed(blocks)
    x = torch.rand(1, 3, 32, 32, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.rand(1, 3, 32, 32, generator=g, dtype=torch.float64)
    seen = set()
    for seed in range(12):
        d = draw_bsr((3, 32, 32), blocks, 24.0, torch.Generator().manual_seed(seed))
        seen.add(d.first)
        assert len(d.lengths) == len(d.order) == len(d.angles) == blocks and all(-24 <= a <= 24 for a in d.angles)
        lo, hi = {2: (11, 21), 3: (6, 16)}[blocks]  # TransferAttack's sizes (U(1, 2] proportions) at 32 px
        assert all(lo <= n <= hi for n in d.lengths + sum(d.piece_lengths, [])), d
        ours, ref = apply_bsr(x, d), _ta_shuffle(x, d)
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(torch.autograd.grad((ours * w).sum(), x)[0],
                                   torch.autograd.grad((ref * w).sum(), x)[0], rtol=0, atol=1e-12)
    assert seen == {2, 3}  # both cut orders were exercised
    # the attack's transform draws per image from that image's generator: copy k of image i is
    # apply_bsr with the k-th draw of its generator
    xs = torch.rand(3, 3, 32, 32, generator=g, dtype=torch.float64)
    gens = [torch.Generator().manual_seed(100 + i) for i in range(3)]
    twins = [torch.Generator().manual_seed(100 + i) for i in range(3)]
    t = BlockShuffleRotation(gens, blocks=blocks, degrees=24.0)
    for _ in range(2):
        out = t(xs)
        ref = torch.cat([_ta_shuffle(xs[i:i + 1], draw_bsr((3, 32, 32), blocks, 24.0, twins[i])) for i in range(3)])
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


def test_earlier_versions_stay_reproducible():
    """``form: equation`` (SGM with γ = 0.5, LinBP) and ``form: v1`` (BSR) reproduce, bit for bit,
    the version-1 fingerprints recorded before the authors' forms became the defaults."""
    from advtransfer.attacks.fingerprint import fingerprint

    assert fingerprint("sgm", {"form": "equation", "gamma": 0.5}, "residual") == "13bfe1712440db91"
    assert fingerprint("linbp", {"form": "equation"}, "plain") == "43a4b5870c0ce695"
    assert fingerprint("bsr", {"form": "v1"}) == "550ea16a794b6446"


# --- PAS ------------------------------------------------------------------------------------------

def test_pas_plain_path_is_the_gradient_and_its_sgm_point_is_the_equation_form(images):
    """PAS's path space is the PAS paper's: per stage, every residual branch decayed by γ_s. Its
    γ = 1, δ = 1 path is MI-FGSM exactly, and its SGM point (γ_s = γ) is SGM's ``form:
    equation``; the authors' SGM (first block of each stage left alone, ReLU scaling) lies
    outside that space, and PAS keeps the paper's form."""
    x, y = images
    model = _harness_resnet20(5)
    kw = dict(eps=8 / 255, steps=3)
    mi = create_attack("mifgsm", **kw)(SurrogateSet(model), x, y)
    pas1 = create_attack("pas", gammas=[1, 1, 1], deltas=[1, 1, 1], **kw)(SurrogateSet(model), x, y)
    torch.testing.assert_close(pas1, mi, rtol=0, atol=0)
    pas_sgm = create_attack("pas", gammas=[0.4] * 3, deltas=[1.0] * 3, **kw)(SurrogateSet(model), x, y)
    sgm_eq = create_attack("sgm", gamma=0.4, form="equation", **kw)(SurrogateSet(model), x, y)
    torch.testing.assert_close(pas_sgm, sgm_eq, rtol=0, atol=0)
    sgm_authors = create_attack("sgm", gamma=0.4, **kw)(SurrogateSet(model), x, y)
    assert float((sgm_authors - sgm_eq).abs().max()) > 0  # a different point


# --- white-box success on a trained ci ResNet-20 --------------------------------------------------

def test_white_box_success_of_the_authors_forms(trained, test_data):
    """The issue's finding: the harness's version-1 SGM and LinBP were weaker than the authors' code
    even on their own surrogate. On the cpu-size ResNet-20 (test images 0-199) this code measured
    white-box success MI-FGSM 99.1%, SGM γ = 0.2 94.0% (``form: equation`` 72.4%), LinBP 99.1%
    (``form: equation`` 92.2%): the issue's TransferAttack and harness figures to the image. The ci
    ResNet-20 (test images 0-199, 96 clean-correct) is weaker and the authors' SGM is further from
    MI-FGSM there: MI-FGSM 93.8%, SGM 82.3% (equation 64.6%), LinBP 85.4% (equation 72.9%) on one
    machine; on another CPU, whose float rounding trains a slightly different ci model, MI-FGSM
    95.9%, SGM 80.4% (equation 60.8%), LinBP 91.8% (equation 81.4%). Asserted with margins of about
    four images over the larger gap: SGM within 20 points of MI-FGSM, and the authors' forms well
    above version 1 (SGM by 10 points, LinBP by 5)."""
    model = trained("resnet20_a")
    x, y, idx = test_data
    with torch.no_grad():
        ok = model(x).argmax(1) == y
    assert int(ok.sum()) >= 60, "too few clean-correct images for a rate"

    def asr(name: str, **p) -> float:
        xa = create_attack(name, eps=8 / 255, steps=10, **p)(SurrogateSet(model), x, y, idx)
        with torch.no_grad():
            return 100.0 * float(((model(xa).argmax(1) != y) & ok).sum()) / int(ok.sum())

    mi = asr("mifgsm")
    sgm, sgm_eq = asr("sgm", gamma=0.2), asr("sgm", gamma=0.2, form="equation")
    linbp, linbp_eq = asr("linbp"), asr("linbp", form="equation")
    seen = f"MI-FGSM {mi:.1f}%, SGM {sgm:.1f}% (equation {sgm_eq:.1f}%), LinBP {linbp:.1f}% (equation {linbp_eq:.1f}%)"
    assert sgm >= mi - 20.0, seen
    assert sgm >= sgm_eq + 10.0, seen
    assert linbp >= linbp_eq + 5.0, seen
