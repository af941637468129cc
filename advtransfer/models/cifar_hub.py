"""CIFAR-10 models of the chenyaofo/pytorch-cifar-models collection (torch.hub repository
``chenyaofo/pytorch-cifar-models``), written in this project's own code with the upstream module
names, so that the released state dicts load with ``strict=True``:

* ``resnet20``, ``resnet32``, ``resnet44``, ``resnet56``: the 3-stage CIFAR ResNet (16/32/64
  channels, BasicBlock; a 1×1 conv + BN ``downsample`` where the shape changes);
* ``vgg11_bn``, ``vgg13_bn``, ``vgg16_bn``, ``vgg19_bn``: VGG with BatchNorm (``features``) and a
  512-512-10 MLP with dropout (``classifier``); 32×32 inputs only (five 2×2 pools down to 1×1);
* ``mobilenetv2_x0_5``, ``_x0_75``, ``_x1_0``, ``_x1_4``: MobileNetV2 with the CIFAR strides (stem
  and the second stage at stride 1);
* ``shufflenetv2_x0_5``, ``_x1_0``, ``_x1_5``, ``_x2_0``: ShuffleNetV2 (stage repeats 4/8/4) with
  the CIFAR changes (stride-1 stem, no stem max-pool);
* ``repvgg_a0``, ``repvgg_a1``, ``repvgg_a2``: RepVGG-A (blocks 2/4/14/1, no grouped layers) in its
  train-time multi-branch form (3×3 conv-BN ``rbr_dense``, 1×1 conv-BN ``rbr_1x1`` and, where the
  shape is kept, a BN ``rbr_identity``), the form the released state dicts hold; stem and first
  stage at stride 1. The deploy-time re-parameterisation (one fused 3×3 conv) is not implemented.

Left out: the collection's ViT (no released weights); its CIFAR-100 releases.

The released networks expect normalised inputs (the codebase's data pipeline normalises with the
mean/std below, read from the training configuration printed at the top of each of the
collection's CIFAR-10 training logs, branch ``logs``: ``logs/cifar10/<model>/default.log``). Here
every model is wrapped in :class:`~advtransfer.models.archs.ImageClassifier` with that mean/std, so
it takes pixels in [0,1] (N×3×32×32) like every other zoo model. Note the std: it is the commonly
copied (0.2023, 0.1994, 0.2010), not the project's own CIFAR-10 std; the released weights were
trained with it.

:data:`MODELS` pins each release: its URL (release tag + file name), the first 8 hex digits of the
file's sha256 as written in its file name (torch.hub's ``check_hash`` convention) and the top-1
accuracy the collection's README reports on the CIFAR-10 test set. Loading the weights is done by
:func:`advtransfer.models.pretrained.build_cifar_hub`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from ..core.errors import UserError
from .archs import ImageClassifier

# From the collection's CIFAR-10 training logs (the `data` block of the printed configuration).
HUB_MEAN = (0.4914, 0.4822, 0.4465)
HUB_STD = (0.2023, 0.1994, 0.2010)

RELEASES = "https://github.com/chenyaofo/pytorch-cifar-models/releases/download"


@dataclass(frozen=True)
class HubModel:
    """One released CIFAR-10 model: ``release`` is the GitHub release tag holding its file."""

    name: str
    release: str
    sha256_prefix: str  # first 8 hex digits of the file's sha256 (in its file name)
    top1: float  # CIFAR-10 test top-1 accuracy (%) reported by the collection's README

    @property
    def file_name(self) -> str:
        return f"cifar10_{self.name}-{self.sha256_prefix}.pt"

    @property
    def url(self) -> str:
        return f"{RELEASES}/{self.release}/{self.file_name}"


# Prefixes and accuracies as listed in the README's CIFAR-10 table and the `*_pretrained_weight_urls`
# dicts of pytorch_cifar_models/{resnet,vgg,mobilenetv2,shufflenetv2,repvgg}.py (commit 786c162).
MODELS: dict[str, HubModel] = {m.name: m for m in (
    HubModel("resnet20", "resnet", "4118986f", 92.60),
    HubModel("resnet32", "resnet", "ef93fc4d", 93.53),
    HubModel("resnet44", "resnet", "2a3cabcb", 94.01),
    HubModel("resnet56", "resnet", "187c023a", 94.37),
    HubModel("vgg11_bn", "vgg", "eaeebf42", 92.79),
    HubModel("vgg13_bn", "vgg", "c01e4a43", 94.00),
    HubModel("vgg16_bn", "vgg", "6ee7ea24", 94.16),
    HubModel("vgg19_bn", "vgg", "57191229", 93.91),
    HubModel("mobilenetv2_x0_5", "mobilenetv2", "ca14ced9", 92.88),
    HubModel("mobilenetv2_x0_75", "mobilenetv2", "a53c314e", 93.72),
    HubModel("mobilenetv2_x1_0", "mobilenetv2", "fe6a5b48", 93.79),
    HubModel("mobilenetv2_x1_4", "mobilenetv2", "3bbbd6e2", 94.22),
    HubModel("shufflenetv2_x0_5", "shufflenetv2", "1308b4e9", 90.13),
    HubModel("shufflenetv2_x1_0", "shufflenetv2", "98807be3", 92.98),
    HubModel("shufflenetv2_x1_5", "shufflenetv2", "296694dd", 93.55),
    HubModel("shufflenetv2_x2_0", "shufflenetv2", "ec31611c", 93.81),
    HubModel("repvgg_a0", "repvgg", "ef08a50e", 94.39),
    HubModel("repvgg_a1", "repvgg", "38d2431b", 94.89),
    HubModel("repvgg_a2", "repvgg", "09488915", 94.98),
)}


# ---------------------------------------------------------------------------------------------
# CIFAR ResNet


class BasicBlock(nn.Module):
    """Two 3×3 conv-BN layers with an identity (or 1×1 conv-BN ``downsample``) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                           if stride != 1 or cin != cout else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + shortcut)


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for 32×32 inputs: a 3×3 stem with 16 channels, three stages of n blocks
    with 16, 32, 64 channels (strides 1, 2, 2), global average pooling and a linear layer."""

    def __init__(self, blocks_per_stage: int, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        width = 16
        for i, (cout, stride) in enumerate(((16, 1), (32, 2), (64, 2)), start=1):
            stage = [BasicBlock(width, cout, stride)] + [BasicBlock(cout, cout) for _ in range(blocks_per_stage - 1)]
            setattr(self, f"layer{i}", nn.Sequential(*stage))
            width = cout
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(64, num_classes)
        _init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ---------------------------------------------------------------------------------------------
# VGG with BatchNorm

VGG_CONFIGS: dict[int, tuple] = {  # channels per stage; a 2×2 max-pool ends each stage
    11: ((64,), (128,), (256, 256), (512, 512), (512, 512)),
    13: ((64, 64), (128, 128), (256, 256), (512, 512), (512, 512)),
    16: ((64, 64), (128, 128), (256,) * 3, (512,) * 3, (512,) * 3),
    19: ((64, 64), (128, 128), (256,) * 4, (512,) * 4, (512,) * 4),
}


class VGG(nn.Module):
    """``features``: [3×3 conv (with bias), BN, ReLU] per layer and a 2×2 max-pool after each of
    the five stages (32×32 → 1×1×512); ``classifier``: Linear 512→512, ReLU, Dropout(0.5),
    Linear 512→512, ReLU, Dropout(0.5), Linear 512→classes."""

    def __init__(self, depth: int, num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for stage in VGG_CONFIGS[depth]:
            for cout in stage:
                layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
                cin = cout
            layers.append(nn.MaxPool2d(2, 2))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(512, 512), nn.ReLU(True), nn.Dropout(0.5),
            nn.Linear(512, 512), nn.ReLU(True), nn.Dropout(0.5),
            nn.Linear(512, num_classes))
        _init(self, linear_std=0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


# ---------------------------------------------------------------------------------------------
# MobileNetV2 (CIFAR strides)

# (expansion t, channels c, blocks n, first stride s); the second row's stride is 1 at CIFAR scale
MBV2_STAGES = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
               (6, 320, 1, 1))


def _divisible(v: float, divisor: int = 8) -> int:
    """Round ``v`` to the nearest multiple of ``divisor`` (at least ``divisor``), rounding up
    once more where plain rounding would lose more than 10% (the MobileNet channel rule)."""
    out = max(divisor, (int(v + divisor / 2) // divisor) * divisor)
    return out + divisor if out < 0.9 * v else out


def _conv_bn_relu6(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    """``conv``: [1×1 expansion conv-BN-ReLU6 (t > 1)], 3×3 depthwise conv-BN-ReLU6, 1×1 linear
    projection conv + BN; a residual connection at stride 1 with equal channels."""

    def __init__(self, cin: int, cout: int, stride: int, t: int) -> None:
        super().__init__()
        hidden = int(round(cin * t))
        layers: list[nn.Module] = [] if t == 1 else [_conv_bn_relu6(cin, hidden, k=1)]
        layers += [_conv_bn_relu6(hidden, hidden, stride=stride, groups=hidden),
                   nn.Conv2d(hidden, cout, 1, 1, 0, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    """``features``: a stride-1 3×3 stem, the inverted-residual stages of :data:`MBV2_STAGES`
    (channels × ``width``, rounded to multiples of 8) and a 1×1 conv to 1280·max(1, width)
    channels; global average pooling; ``classifier``: Dropout(0.2), Linear."""

    def __init__(self, width: float = 1.0, num_classes: int = 10) -> None:
        super().__init__()
        cin = _divisible(32 * width)
        last = _divisible(1280 * max(1.0, width))
        layers: list[nn.Module] = [_conv_bn_relu6(3, cin)]
        for t, c, n, s in MBV2_STAGES:
            cout = _divisible(c * width)
            for i in range(n):
                layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        layers.append(_conv_bn_relu6(cin, last, k=1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))
        _init(self, linear_std=0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


# ---------------------------------------------------------------------------------------------
# ShuffleNetV2 (CIFAR: stride-1 stem, no max-pool)

# output channels of the stem, stage2, stage3, stage4 and conv5 per width
SHUFFLE_CHANNELS: dict[str, tuple[int, int, int, int, int]] = {
    "0_5": (24, 48, 96, 192, 1024), "1_0": (24, 116, 232, 464, 1024),
    "1_5": (24, 176, 352, 704, 1024), "2_0": (24, 244, 488, 976, 2048)}
SHUFFLE_REPEATS = (4, 8, 4)


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, relu: bool = True) -> list[nn.Module]:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    return layers + [nn.ReLU(inplace=True)] if relu else layers


class ShuffleUnit(nn.Module):
    """A ShuffleNetV2 unit. Stride 1: half the channels pass through, the other half go through
    ``branch2`` (1×1 conv-BN-ReLU, 3×3 depthwise conv-BN, 1×1 conv-BN-ReLU). Stride 2: the whole
    input goes through ``branch1`` (3×3 depthwise conv-BN, 1×1 conv-BN-ReLU) and ``branch2``.
    The two halves are concatenated and their channels shuffled (2 groups)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        half = cout // 2
        if stride == 1 and cin != cout:
            raise ValueError("a stride-1 ShuffleNetV2 unit keeps its channel count")
        self.stride = stride
        self.branch1 = (nn.Sequential(*_conv_bn(cin, cin, 3, stride, groups=cin, relu=False), *_conv_bn(cin, half, 1))
                        if stride > 1 else nn.Sequential())
        b2_in = cin if stride > 1 else half
        self.branch2 = nn.Sequential(*_conv_bn(b2_in, half, 1),
                                     *_conv_bn(half, half, 3, stride, groups=half, relu=False),
                                     *_conv_bn(half, half, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            keep, x = x.chunk(2, dim=1)
        else:
            keep = self.branch1(x)
        y = torch.cat((keep, self.branch2(x)), dim=1)
        # channel shuffle: (N, 2·C', H, W) → (N, 2, C', H, W) → swap the two channel axes → flatten
        return y.unflatten(1, (2, -1)).transpose(1, 2).flatten(1, 2)


class ShuffleNetV2(nn.Module):
    """``conv1``: stride-1 3×3 conv-BN-ReLU stem; ``stage2``–``stage4``: a stride-2 unit then
    stride-1 units (:data:`SHUFFLE_REPEATS`); ``conv5``: 1×1 conv-BN-ReLU; global average pooling;
    ``fc``."""

    def __init__(self, width: str, num_classes: int = 10) -> None:
        super().__init__()
        channels = SHUFFLE_CHANNELS[width]
        self.conv1 = nn.Sequential(*_conv_bn(3, channels[0], 3))
        cin = channels[0]
        for i, (n, cout) in enumerate(zip(SHUFFLE_REPEATS, channels[1:4]), start=2):
            setattr(self, f"stage{i}", nn.Sequential(ShuffleUnit(cin, cout, 2),
                                                      *(ShuffleUnit(cout, cout, 1) for _ in range(n - 1))))
            cin = cout
        self.conv5 = nn.Sequential(*_conv_bn(cin, channels[4], 1))
        self.fc = nn.Linear(channels[4], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage4(self.stage3(self.stage2(self.conv1(x))))
        return self.fc(self.conv5(x).mean((2, 3)))


# ---------------------------------------------------------------------------------------------
# RepVGG-A, train-time (multi-branch) form (CIFAR: stem and stage1 at stride 1)

REPVGG_BLOCKS = (2, 4, 14, 1)
REPVGG_WIDTHS: dict[str, tuple[float, float, float, float]] = {
    "a0": (0.75, 0.75, 0.75, 2.5), "a1": (1.0, 1.0, 1.0, 2.5), "a2": (1.5, 1.5, 1.5, 2.75)}


def _named_conv_bn(cin: int, cout: int, k: int, stride: int) -> nn.Sequential:
    branch = nn.Sequential()
    branch.add_module("conv", nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, bias=False))
    branch.add_module("bn", nn.BatchNorm2d(cout))
    return branch


class RepVGGBlock(nn.Module):
    """ReLU(3×3 conv-BN ``rbr_dense`` + 1×1 conv-BN ``rbr_1x1`` [+ BN ``rbr_identity`` when the
    input and output shapes agree])."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.rbr_identity = nn.BatchNorm2d(cin) if cin == cout and stride == 1 else None
        self.rbr_dense = _named_conv_bn(cin, cout, 3, stride)
        self.rbr_1x1 = _named_conv_bn(cin, cout, 1, stride)
        self.nonlinearity = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.rbr_dense(x) + self.rbr_1x1(x)
        if self.rbr_identity is not None:
            y = y + self.rbr_identity(x)
        return self.nonlinearity(y)


class RepVGG(nn.Module):
    """``stage0``: one block 3 → min(64, 64·w₀) channels; ``stage1``–``stage4``: blocks of
    64·w₀, 128·w₁, 256·w₂, 512·w₃ channels (:data:`REPVGG_BLOCKS`; first strides 1, 2, 2, 2);
    ``gap``; ``linear``."""

    def __init__(self, variant: str, num_classes: int = 10) -> None:
        super().__init__()
        w = REPVGG_WIDTHS[variant]
        cin = min(64, int(64 * w[0]))
        self.stage0 = RepVGGBlock(3, cin, 1)
        for i, (n, base, wi, stride) in enumerate(zip(REPVGG_BLOCKS, (64, 128, 256, 512), w, (1, 2, 2, 2)), start=1):
            cout = int(base * wi)
            setattr(self, f"stage{i}", nn.Sequential(*(RepVGGBlock(cin if j == 0 else cout, cout, stride if j == 0 else 1)
                                                       for j in range(n))))
            cin = cout
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.linear = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage4(self.stage3(self.stage2(self.stage1(self.stage0(x)))))
        return self.linear(torch.flatten(self.gap(x), 1))


def _init(model: nn.Module, linear_std: float | None = None) -> None:
    """He-normal (fan-out) convolutions, unit/zero BatchNorm, zero biases; linear layers
    N(0, ``linear_std``) with zero bias when given, else PyTorch's default."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear) and linear_std is not None:
            nn.init.normal_(m.weight, 0.0, linear_std)
            nn.init.zeros_(m.bias)


_BUILDERS: dict[str, Callable[[int], nn.Module]] = {
    **{f"resnet{d}": (lambda nc, d=d: CifarResNet((d - 2) // 6, nc)) for d in (20, 32, 44, 56)},
    **{f"vgg{d}_bn": (lambda nc, d=d: VGG(d, nc)) for d in (11, 13, 16, 19)},
    **{f"mobilenetv2_x{w}": (lambda nc, w=w: MobileNetV2(float(w.replace("_", ".")), nc))
       for w in ("0_5", "0_75", "1_0", "1_4")},
    **{f"shufflenetv2_x{w}": (lambda nc, w=w: ShuffleNetV2(w, nc)) for w in SHUFFLE_CHANNELS},
    **{f"repvgg_{v}": (lambda nc, v=v: RepVGG(v, nc)) for v in REPVGG_WIDTHS},
}


def get(name: str) -> HubModel:
    """The pinned release of ``name``; a one-line UserError for an unknown name."""
    if name not in MODELS:
        from ..core.registry import suggest

        raise UserError(suggest(name, list(MODELS), "cifar_hub model") + " (chenyaofo/pytorch-cifar-models, CIFAR-10)")
    return MODELS[name]


def build_net(name: str, num_classes: int = 10) -> nn.Module:
    """The bare network ``name`` (normalised inputs, upstream state-dict layout), freshly initialised."""
    get(name)
    return _BUILDERS[name](num_classes)


def build(name: str, num_classes: int = 10) -> ImageClassifier:
    """``name`` wrapped to take pixels in [0,1] (normalised inside with :data:`HUB_MEAN`/:data:`HUB_STD`);
    its released state dict loads into ``.net``."""
    return ImageClassifier(build_net(name, num_classes), HUB_MEAN, HUB_STD, channels_last=True)


def load_state(model: ImageClassifier, state: object, where: str) -> None:
    """Load a released state dict into ``model.net`` with strict keys and shapes (one-line
    UserError naming the first differences if it does not fit)."""
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{where}: not a state dict (a mapping of names to tensors)")
    expected = model.net.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}" for k, v in expected.items()
              if k in state and tuple(state[k].shape) != tuple(v.shape)]
    problems = [f"{label} {len(items)} ({', '.join(items[:3])}{', ...' if len(items) > 3 else ''})"
                for label, items in (("missing keys", missing), ("unexpected keys", unexpected),
                                     ("shape mismatches", shapes)) if items]
    if problems:
        raise UserError(f"{where} does not fit {type(model.net).__name__}: {'; '.join(problems)}")
    model.net.load_state_dict(state, strict=True)
