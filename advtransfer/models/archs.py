"""Architectures at CIFAR scale (32×32 inputs), registered by name.

Each builder takes ``num_classes`` plus its own keyword arguments and returns an ``nn.Module`` that
maps *normalised* images N×3×H×W to logits N×num_classes; :class:`ImageClassifier` adds the
normalisation so that zoo models take pixels in [0, 1].
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..core.registry import Registry

ARCHS: Registry[Callable[..., nn.Module]] = Registry("architecture")

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


class ImageClassifier(nn.Module):
    """Wraps a network so that it takes pixels in [0,1] (N×C×H×W) and normalises inside."""

    def __init__(self, net: nn.Module, mean: Sequence[float] = CIFAR10_MEAN,
                 std: Sequence[float] = CIFAR10_STD, channels_last: bool = False) -> None:
        super().__init__()
        self.net = net
        # channels_last speeds CPU convolutions 1.5-2.5x; it changes no result beyond float rounding.
        self.channels_last = channels_last
        if channels_last:
            self.net.to(memory_format=torch.channels_last)
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = (x - self.mean) / self.std
        if self.channels_last:
            z = z.contiguous(memory_format=torch.channels_last)
        return self.net(z)


def build_arch(arch: str, num_classes: int = 10, **kwargs: Any) -> nn.Module:
    """Build a registered architecture; ``timm/<name>`` builds a timm model for 32×32 inputs."""
    if arch.startswith("timm/"):
        import timm

        name = arch[len("timm/"):]
        return timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)
    return ARCHS.get(arch)(num_classes=num_classes, **kwargs)


def _conv_bn(cin: int, cout: int, stride: int = 1, groups: int = 1, k: int = 3) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


@ARCHS.register("tinycnn", family="cnn")
def tinycnn(num_classes: int = 10, width: int = 32) -> nn.Module:
    """Four 3×3 conv layers (about 0.1M parameters); trains in seconds, for tests."""
    w = width
    return nn.Sequential(_conv_bn(3, w), nn.MaxPool2d(2), _conv_bn(w, 2 * w), nn.MaxPool2d(2),
                         _conv_bn(2 * w, 2 * w), nn.MaxPool2d(2), _conv_bn(2 * w, 4 * w),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * w, num_classes))


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        # activations as modules (no parameters, so checkpoints are unchanged) so that backward-path
        # surgery (LinBP, see advtransfer.attacks.surgery) can reach them; bn2 ends the residual branch
        self.act1 = nn.ReLU()
        self.act2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.act2(out + (x if self.short is None else self.short(x)))


class CifarResNet(nn.Module):
    """CIFAR ResNet (He et al. 2016): depth 6n+2, widths w, 2w, 4w."""

    def __init__(self, depth: int = 20, width: int = 16, num_classes: int = 10) -> None:
        super().__init__()
        if (depth - 2) % 6:
            raise ValueError("CIFAR ResNet depth must be 6n+2 (8, 14, 20, 32, 56, 110)")
        n = (depth - 2) // 6
        self.stem = _conv_bn(3, width)
        layers, cin = [], width
        for i, w in enumerate((width, 2 * width, 4 * width)):
            for j in range(n):
                layers.append(_BasicBlock(cin, w, 2 if (j == 0 and i > 0) else 1))
                cin = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@ARCHS.register("resnet", family="cnn")
def resnet(num_classes: int = 10, depth: int = 20, width: int = 16) -> nn.Module:
    """CIFAR ResNet of depth 6n+2 (resnet20 by default, 0.27M parameters)."""
    return CifarResNet(depth, width, num_classes)


@ARCHS.register("vgg", family="cnn")
def vgg(num_classes: int = 10, cfg: Sequence[int | str] = (32, "M", 64, "M", 128, 128, "M", 256, "M"),
        ) -> nn.Module:
    """CIFAR-style VGG with BatchNorm ('M' = 2×2 max-pool), global pooling and one linear layer."""
    layers: list[nn.Module] = []
    cin = 3
    for c in cfg:
        if c == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers.append(_conv_bn(cin, int(c)))
            cin = int(c)
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))


class _InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        mid = cin * expand
        self.block = nn.Sequential(
            _conv_bn(cin, mid, k=1) if expand != 1 else nn.Identity(),
            _conv_bn(mid, mid, stride, groups=mid),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.residual else out


@ARCHS.register("mobilenet", family="mobile")
def mobilenet(num_classes: int = 10, width: int = 16, expand: int = 4,
              stages: Sequence[Sequence[int]] = ((1, 1, 1), (2, 2, 2), (4, 2, 2), (8, 2, 2))) -> nn.Module:
    """MobileNetV2-style net of depthwise-separable inverted residuals.

    ``stages`` lists (width multiple, blocks, stride of the first block).
    """
    layers: list[nn.Module] = [_conv_bn(3, width)]
    cin = width
    for mult, blocks, stride in stages:
        for b in range(blocks):
            layers.append(_InvertedResidual(cin, width * mult, stride if b == 0 else 1, expand))
            cin = width * mult
    layers += [_conv_bn(cin, 4 * cin, k=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * cin, num_classes)]
    return nn.Sequential(*layers)


class _DenseLayer(nn.Module):
    def __init__(self, cin: int, growth: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(inplace=True),
                                  nn.Conv2d(cin, 4 * growth, 1, bias=False),
                                  nn.BatchNorm2d(4 * growth), nn.ReLU(inplace=True),
                                  nn.Conv2d(4 * growth, growth, 3, 1, 1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.body(x)], 1)


@ARCHS.register("densenet", family="dense")
def densenet(num_classes: int = 10, growth: int = 12, blocks: Sequence[int] = (4, 4, 4),
             reduction: float = 0.5) -> nn.Module:
    """DenseNet-BC at CIFAR scale (bottleneck layers, compressing transitions)."""
    c = 2 * growth
    layers: list[nn.Module] = [nn.Conv2d(3, c, 3, 1, 1, bias=False)]
    for i, n in enumerate(blocks):
        for _ in range(n):
            layers.append(_DenseLayer(c, growth))
            c += growth
        if i < len(blocks) - 1:
            out = int(c * reduction)
            layers += [nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.Conv2d(c, out, 1, bias=False), nn.AvgPool2d(2)]
            c = out
    layers += [nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
               nn.Linear(c, num_classes)]
    return nn.Sequential(*layers)


@ARCHS.register("vit", family="vit")
def vit(num_classes: int = 10, patch_size: int = 4, embed_dim: int = 128, depth: int = 4,
        num_heads: int = 4, mlp_ratio: float = 2.0) -> nn.Module:
    """Small ViT for 32×32 inputs, built by timm's VisionTransformer (patch 4 → 64 tokens)."""
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(img_size=32, patch_size=patch_size, num_classes=num_classes,
                             embed_dim=embed_dim, depth=depth, num_heads=num_heads,
                             mlp_ratio=mlp_ratio, global_pool="avg", class_token=False)


class _FrozenScaleBN(nn.BatchNorm2d):
    """BatchNorm whose scale stays 1 (only the shift trains), eps 1e-12: airbench's ``BatchNorm``.
    ``momentum`` is airbench's (the weight kept of the old running statistics): torch's is 1 − it."""

    def __init__(self, num_features: int, momentum: float = 0.6) -> None:
        super().__init__(num_features, eps=1e-12, momentum=1 - momentum)
        self.weight.requires_grad_(False)


class _DiracConv(nn.Conv2d):
    """3×3 'same' convolution whose first ``in_channels`` filters start as the identity (airbench's
    ``Conv``: ``torch.nn.init.dirac_`` on top of the default initialisation)."""

    def __init__(self, cin: int, cout: int, kernel_size: int = 3, padding: int | str = "same",
                 bias: bool = False) -> None:
        super().__init__(cin, cout, kernel_size, padding=padding, bias=bias)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.bias is not None:
            self.bias.data.zero_()
        w = self.weight.data
        torch.nn.init.dirac_(w[:w.size(1)])


class _ConvGroup(nn.Module):
    """conv → max-pool 2 → BN → GELU → conv → BN → GELU (airbench's ``ConvGroup``)."""

    def __init__(self, cin: int, cout: int, bn_momentum: float) -> None:
        super().__init__()
        self.conv1 = _DiracConv(cin, cout)
        self.pool = nn.MaxPool2d(2)
        self.norm1 = _FrozenScaleBN(cout, bn_momentum)
        self.conv2 = _DiracConv(cout, cout)
        self.norm2 = _FrozenScaleBN(cout, bn_momentum)
        self.activ = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.activ(self.norm1(self.pool(self.conv1(x))))
        return self.activ(self.norm2(self.conv2(x)))


class AirbenchNet(nn.Module):
    """The plain-convolution net of airbench (Jordan 2024, ``KellerJordan/cifar10-airbench``,
    ``make_net93``/``make_net94``): a frozen 2×2 patch-whitening convolution (24 filters: the
    eigenvectors of the training patches' covariance and their negatives, set from data by
    :meth:`init_whitening` before training) with a trainable bias, GELU, three conv groups,
    3×3 max-pool, a bias-free linear head and a fixed output scale of 1/9.

    Takes normalised images N×3×32×32. ``widths`` (64, 128, 128) is airbench93, (64, 256, 256)
    airbench94.
    """

    def __init__(self, num_classes: int = 10, widths: Sequence[int] = (64, 128, 128),
                 bn_momentum: float = 0.6, scale: float = 1 / 9) -> None:
        super().__init__()
        k = 2
        self.whiten = _DiracConv(3, 2 * 3 * k * k, k, padding=0, bias=True)
        self.whiten.weight.requires_grad_(False)
        self.act = nn.GELU()
        groups, cin = [], self.whiten.out_channels
        for w in widths:
            groups.append(_ConvGroup(cin, int(w), bn_momentum))
            cin = int(w)
        self.layers = nn.Sequential(*groups)
        self.pool = nn.MaxPool2d(3)
        self.fc = nn.Linear(cin, num_classes, bias=False)
        self.scale = float(scale)

    @torch.no_grad()
    def init_whitening(self, x: torch.Tensor, eps: float = 5e-4) -> None:
        """Set the whitening filters from normalised training images ``x`` (N×3×32×32; airbench
        uses the first 5,000): every 2×2 patch, the eigen-decomposition of their covariance,
        filters = eigenvectors / sqrt(eigenvalue + eps) and their negatives (``init_whitening_conv``)."""
        c, (h, w) = x.shape[1], self.whiten.weight.shape[2:]
        patches = x.float().unfold(2, h, 1).unfold(3, w, 1).transpose(1, 3).reshape(-1, c, h, w)
        flat = patches.reshape(len(patches), -1)
        cov = (flat.T @ flat) / len(flat)
        evals, evecs = torch.linalg.eigh(cov, UPLO="U")
        evals = evals.flip(0).view(-1, 1, 1, 1)
        evecs = evecs.T.reshape(c * h * w, c, h, w).flip(0)
        scaled = evecs / torch.sqrt(evals + eps)
        self.whiten.weight.copy_(torch.cat((scaled, -scaled)).to(self.whiten.weight))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.act(self.whiten(x)))
        return self.fc(torch.flatten(self.pool(x), 1)) * self.scale


@ARCHS.register("airbench", family="cnn")
def airbench(num_classes: int = 10, widths: Sequence[int] = (64, 128, 128), bn_momentum: float = 0.6,
             scale: float = 1 / 9) -> nn.Module:
    """airbench's VGG-style net (see :class:`AirbenchNet`; airbench93's widths by default, 1.0M parameters)."""
    return AirbenchNet(num_classes, widths, bn_momentum, scale)


class _SeqPool(nn.Module):
    """CCT's sequence pooling: a learned softmax weight per token, the weighted mean of the tokens."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.attn = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # N×T×D -> N×D
        w = F.softmax(self.attn(x), dim=1)
        return (w.transpose(1, 2) @ x).squeeze(1)


class CompactTransformer(nn.Module):
    """A Compact Convolutional Transformer (Hassani et al. 2021, arXiv 2104.05704; CCT-L/3x2):
    ``conv_layers`` blocks of conv 3×3 (no bias) → ReLU → max-pool 3×3 stride 2 tokenize the image
    (32×32 → 8×8 = 64 tokens for two), a learned position embedding, ``depth`` pre-norm transformer
    blocks (timm's ``Block``, so attacks that hook transformer branches find them), LayerNorm,
    sequence pooling and a linear head. An attention model with a convolutional stem: it trains to
    a far higher accuracy than a patch ViT on CIFAR-10 in few epochs (the paper's CCT-4/3x2: 91.97%
    after 300 epochs)."""

    def __init__(self, num_classes: int = 10, embed_dim: int = 128, depth: int = 4, num_heads: int = 2,
                 mlp_ratio: float = 1.0, conv_layers: int = 2, conv_width: int = 64, drop_path: float = 0.1,
                 img_size: int = 32) -> None:
        super().__init__()
        from timm.models.vision_transformer import Block

        layers: list[nn.Module] = []
        cin = 3
        for i in range(conv_layers):
            cout = embed_dim if i == conv_layers - 1 else conv_width
            layers += [nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
            cin = cout
        self.tokenizer = nn.Sequential(*layers)
        side = img_size // 2 ** conv_layers
        self.pos_embed = nn.Parameter(torch.zeros(1, side * side, embed_dim))
        nn.init.trunc_normal_(self.pos_embed, std=0.2)
        rates = [drop_path * i / max(1, depth - 1) for i in range(depth)]
        self.blocks = nn.Sequential(*[Block(embed_dim, num_heads, mlp_ratio, qkv_bias=True, drop_path=r)
                                      for r in rates])
        self.norm = nn.LayerNorm(embed_dim)
        self.pool = _SeqPool(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight)
            elif isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.tokenizer(x).flatten(2).transpose(1, 2) + self.pos_embed  # N×T×D
        return self.head(self.pool(self.norm(self.blocks(z))))


@ARCHS.register("cct", family="vit")
def cct(num_classes: int = 10, embed_dim: int = 128, depth: int = 4, num_heads: int = 2, mlp_ratio: float = 1.0,
        conv_layers: int = 2, conv_width: int = 64, drop_path: float = 0.1) -> nn.Module:
    """A Compact Convolutional Transformer (see :class:`CompactTransformer`; CCT-4/3x2's shape by
    default, about 0.4M parameters), in the attention family."""
    return CompactTransformer(num_classes, embed_dim, depth, num_heads, mlp_ratio, conv_layers, conv_width,
                              drop_path)


class EnsembleNet(nn.Module):
    """Several networks of one architecture as one model: ``subnets`` map normalised images to
    logits; the output is log(mean softmax) over them (as DVERGE's evaluation combines its
    members), so argmax is the averaged-probability vote. Trained as one entry (the ensemble
    victims: DVERGE and its plainly trained counterpart)."""

    def __init__(self, subnets: Sequence[nn.Module]) -> None:
        super().__init__()
        self.subnets = nn.ModuleList(subnets)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.stack([F.softmax(m(x), dim=1) for m in self.subnets]).mean(0)
        return probs.clamp_min(1e-40).log()


@ARCHS.register("ensemble", family="ensemble")
def ensemble(num_classes: int = 10, members: int = 3, member_arch: str = "resnet",
             member_kwargs: dict | None = None) -> nn.Module:
    """``members`` independently initialised ``member_arch`` networks combined by
    :class:`EnsembleNet` (three ResNet-20 by default)."""
    if not isinstance(members, int) or members < 2:
        raise ValueError("an ensemble needs members >= 2")
    return EnsembleNet([build_arch(member_arch, num_classes=num_classes, **(member_kwargs or {}))
                        for _ in range(members)])
