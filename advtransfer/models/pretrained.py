"""Pretrained zoo entries that the harness does not train: open_clip zero-shot classifiers and timm
ImageNet models. An entry has ``pretrained:`` instead of ``recipe:``:

    - name: clip_vit_b32                 # victims/clip.yaml
      arch: open_clip/ViT-B-32           # open_clip architecture
      family: clip
      dataset: cifar10                   # class names for the zero-shot head
      pretrained: {tag: laion2b_s34b_b79k, templates: cifar10}   # optional weights: /path/to/file

    - name: resnet50_in1k                # surrogates/imagenet.yaml
      arch: timm/resnet50
      family: timm
      dataset: imagenet
      num_classes: 1000
      pretrained: {tag: a1_in1k}         # timm's resnet50.a1_in1k; optional weights: /path/to/file

Either model takes pixels in [0,1] (N×3×H×W, any H×W such as 32×32) and applies its own
preprocessing inside: resize (and, for timm, the crop of its data config) and normalisation.
Weights come from the internet (Hugging Face hub) or from a local ``weights`` file; offline
without one, loading fails with one line saying so. ``random_init: true`` builds the architecture
at random initialisation, for wiring tests only (the card then says ``kind: random_init``; such
a model must never be used for reported numbers). ``model_config`` registers an open_clip
architecture given inline (a tiny one for tests).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import UserError

LOADERS = ("open_clip", "timm")
PRETRAINED_KEYS = {"tag", "weights", "random_init", "templates", "model_config"}

# The 18 CIFAR prompt templates of the CLIP paper's zero-shot evaluation.
CIFAR_TEMPLATES = tuple(
    f"a {q}photo of {a} {{}}." for a in ("a", "the")
    for q in ("", "blurry ", "black and white ", "low contrast ", "high contrast ", "bad ", "good ")
) + tuple(f"a photo of {a} {s} {{}}." for a in ("a", "the") for s in ("small", "big"))


def loader_of(arch: str) -> tuple[str, str]:
    """``open_clip/ViT-B-32`` → (``open_clip``, ``ViT-B-32``); raises for another prefix."""
    kind, _, name = arch.partition("/")
    if kind not in LOADERS or not name:
        raise UserError(f"pretrained entry arch {arch!r} must be open_clip/<architecture> or timm/<model>")
    return kind, name


def check_entry(name: str, arch: str, pretrained: Any, source: str) -> None:
    """Validate the ``pretrained:`` block of a zoo entry (one-line errors)."""
    if not isinstance(pretrained, dict):
        raise UserError(f"{source}: model {name!r}: pretrained must be a mapping like {{tag: ..., weights: ...}}")
    extra = set(pretrained) - PRETRAINED_KEYS
    if extra:
        raise UserError(f"{source}: model {name!r}: unknown pretrained keys {sorted(extra)}; allowed: {sorted(PRETRAINED_KEYS)}")
    loader_of(arch)
    if not (pretrained.get("tag") or pretrained.get("weights") or pretrained.get("random_init")):
        raise UserError(f"{source}: model {name!r}: pretrained needs a tag, a weights file or random_init: true")


def _weights_file(spec) -> str | None:
    w = spec.pretrained.get("weights")
    if not w:
        return None
    path = Path(os.path.expandvars(str(w))).expanduser()
    if not path.is_file():
        raise UserError(f"model {spec.name!r}: weights file {str(path)!r} does not exist ({spec.source})")
    return str(path)


def _offline_error(spec, exc: Exception) -> UserError:
    tag = spec.pretrained.get("tag")
    return UserError(f"model {spec.name!r}: cannot load pretrained weights {spec.arch}:{tag} "
                     f"({type(exc).__name__}; no internet?); run once with internet or give a local "
                     f"file as `weights:` in {spec.source}")


def class_names(dataset: str, n: int) -> list[str]:
    """Class names for a zero-shot head: CIFAR-10's, ImageNet's (open_clip's list), else indices."""
    from ..data import CIFAR10_CLASSES

    if dataset == "cifar10":
        return list(CIFAR10_CLASSES)
    if dataset == "imagenet":
        from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

        return list(IMAGENET_CLASSNAMES)
    return [str(i) for i in range(n)]


def templates(spec) -> list[str]:
    t = spec.pretrained.get("templates", "cifar10" if spec.dataset == "cifar10" else "imagenet")
    if isinstance(t, list) and t and all(isinstance(s, str) and "{}" in s for s in t):
        return t
    if t == "cifar10":
        return list(CIFAR_TEMPLATES)
    if t in ("imagenet", "simple"):
        from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES, SIMPLE_IMAGENET_TEMPLATES

        return [f("{}") for f in (OPENAI_IMAGENET_TEMPLATES if t == "imagenet" else SIMPLE_IMAGENET_TEMPLATES)]
    raise UserError(f"model {spec.name!r}: templates must be cifar10, imagenet, simple or a list of strings with {{}}")


class ZeroShotCLIP(nn.Module):
    """An open_clip image tower with a zero-shot head. Input: pixels in [0,1], N×3×H×W (any
    size); resized to the model's resolution with its interpolation, normalised with its mean/std;
    output: logits N×C = scale · normalise(encode_image(x)) · head (head: D×C, unit columns)."""

    def __init__(self, visual: nn.Module, head: torch.Tensor, image_size: Sequence[int], mean: Sequence[float],
                 std: Sequence[float], interpolation: str = "bicubic", logit_scale: float = 100.0) -> None:
        super().__init__()
        self.visual = visual
        self.register_buffer("head", head.detach().clone())
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.image_size = tuple(int(s) for s in image_size)
        self.interpolation = interpolation if interpolation in ("bilinear", "bicubic", "nearest") else "bicubic"
        self.logit_scale = float(logit_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) != self.image_size:
            x = F.interpolate(x, size=self.image_size, mode=self.interpolation, align_corners=False)
        f = self.visual((x - self.mean) / self.std)
        return self.logit_scale * F.normalize(f, dim=-1) @ self.head


class TimmPreprocessed(nn.Module):
    """A timm model with its data config applied inside. Input: pixels in [0,1], N×3×H×W (any
    size). Unless already at the model's input size, the shorter side is resized to
    input/crop_pct with the config's interpolation and the centre input×input is cropped ('squash'
    crop mode: both sides resized); then normalised with the config's mean/std."""

    def __init__(self, net: nn.Module, config: dict) -> None:
        super().__init__()
        self.net = net
        self.config = dict(config)
        self.input_size = tuple(int(s) for s in config["input_size"][1:])
        interp = config.get("interpolation", "bilinear")
        self.interpolation = interp if interp in ("bilinear", "bicubic", "nearest") else "bilinear"
        self.crop_pct = float(config.get("crop_pct") or 1.0)
        self.crop_mode = config.get("crop_mode", "center")
        self.register_buffer("mean", torch.tensor(config["mean"], dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(config["std"], dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def preprocess(self, x: torch.Tensor) -> torch.Tensor:
        """Resize and crop pixels [0,1] to the model's input size (differentiable)."""
        h, w = x.shape[-2:]
        th, tw = self.input_size
        if (h, w) != (th, tw):
            sh, sw = math.floor(th / self.crop_pct), math.floor(tw / self.crop_pct)
            if self.crop_mode != "squash":  # keep the aspect ratio: shorter side → scale size
                r = max(sh / h, sw / w)
                sh, sw = max(th, round(h * r)), max(tw, round(w * r))
            x = F.interpolate(x, size=(sh, sw), mode=self.interpolation, align_corners=False,
                              antialias=self.interpolation != "nearest" and sh < h)
            top, left = (sh - th) // 2, (sw - tw) // 2
            x = x[..., top:top + th, left:left + tw]
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((self.preprocess(x) - self.mean) / self.std)


def _register_inline_config(spec) -> None:
    import open_clip

    cfg = spec.pretrained.get("model_config")
    if cfg is None:
        return
    if not isinstance(cfg, dict):
        raise UserError(f"model {spec.name!r}: model_config must be an open_clip model config mapping")
    _, arch = loader_of(spec.arch)
    folder = Path(tempfile.mkdtemp(prefix="advtransfer-openclip-"))
    (folder / f"{arch}.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(folder / f"{arch}.json")


def build_open_clip(spec, device: str = "cpu") -> ZeroShotCLIP:
    import open_clip

    _, arch = loader_of(spec.arch)
    _register_inline_config(spec)
    if arch not in open_clip.list_models():
        raise UserError(f"model {spec.name!r}: open_clip has no architecture {arch!r} (see open_clip.list_models())")
    weights = _weights_file(spec)
    random_init = bool(spec.pretrained.get("random_init"))
    pretrained = None if random_init else (weights or spec.pretrained.get("tag"))
    try:
        model = open_clip.create_model(arch, pretrained=pretrained, device=device)
    except UserError:
        raise
    except Exception as exc:  # hub download or file load failed
        raise _offline_error(spec, exc) from None
    model.eval()
    tokenizer = open_clip.get_tokenizer(arch)
    with torch.no_grad():
        head = open_clip.build_zero_shot_classifier(model, tokenizer, class_names(spec.dataset, spec.num_classes),
                                                    templates(spec), device=device)
    cfg = getattr(model.visual, "preprocess_cfg", {}) or {}
    size = cfg.get("size", getattr(model.visual, "image_size", 224))
    size = (size, size) if isinstance(size, int) else size
    mean = cfg.get("mean", open_clip.OPENAI_DATASET_MEAN)
    std = cfg.get("std", open_clip.OPENAI_DATASET_STD)
    wrapped = ZeroShotCLIP(model.visual, head, size, mean, std, cfg.get("interpolation", "bicubic"),
                           float(model.logit_scale.detach().exp()))
    return wrapped


def build_timm(spec, device: str = "cpu") -> TimmPreprocessed:
    import timm

    _, arch = loader_of(spec.arch)
    tag = spec.pretrained.get("tag")
    name = f"{arch}.{tag}" if tag and "." not in arch else arch
    weights = _weights_file(spec)
    random_init = bool(spec.pretrained.get("random_init"))
    kwargs = dict(spec.arch_kwargs)
    if spec.num_classes:
        kwargs.setdefault("num_classes", spec.num_classes)
    try:
        if random_init:
            net = timm.create_model(name, pretrained=False, **kwargs)
        elif weights:
            net = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": weights}, **kwargs)
        else:
            net = timm.create_model(name, pretrained=True, **kwargs)
    except UserError:
        raise
    except RuntimeError as exc:
        if "Unknown model" in str(exc):
            raise UserError(f"model {spec.name!r}: timm has no model {name!r}") from None
        raise _offline_error(spec, exc) from None
    except Exception as exc:
        raise _offline_error(spec, exc) from None
    config = timm.data.resolve_data_config({}, model=net)
    return TimmPreprocessed(net, config)


def build_pretrained(spec, device: str = "cpu") -> nn.Module:
    """The eval-mode module of a pretrained entry (weights frozen); see the module docstring.
    Torch's global random state is left unchanged (building initialises weights at random before
    loading any); a ``random_init`` entry is initialised from seed 0, for reproducible wiring tests."""
    from ..rng import seeded

    kind, _ = loader_of(spec.arch)
    with seeded(0 if spec.pretrained.get("random_init") else None, device):
        model = build_open_clip(spec, device) if kind == "open_clip" else build_timm(spec, device)
    model.eval().to(device)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def identity(spec) -> dict:
    """What determines a pretrained entry's weights (hashed into its card's recipe_hash)."""
    return {"arch": spec.arch, "arch_kwargs": spec.arch_kwargs, "dataset": spec.dataset,
            "num_classes": spec.num_classes, "pretrained": spec.pretrained}
