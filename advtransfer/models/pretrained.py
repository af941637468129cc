"""Pretrained zoo entries that the harness does not train: open_clip zero-shot classifiers, timm
ImageNet models, the CIFAR-10 models of chenyaofo/pytorch-cifar-models (``cifar_hub``) and
RobustBench models (``robustbench``). An entry has ``pretrained:`` instead of ``recipe:``:

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

    - name: hub_resnet20                 # victims/cifar10_public.yaml
      arch: cifar_hub/resnet20           # a name of advtransfer.models.cifar_hub.MODELS
      family: public
      pretrained: {tag: "4118986f"}      # optional; must equal the pinned sha256 prefix (quoted)

    - name: rb_wong2020fast
      arch: robustbench/Wong2020Fast     # a RobustBench model name
      family: defended
      pretrained: {tag: Linf}            # RobustBench threat model (Linf, L2, corruptions)

An open_clip or timm model takes pixels in [0,1] (N×3×H×W, any H×W such as 32×32) and applies its own
preprocessing inside: resize (and, for timm, the crop of its data config) and normalisation.
Weights come from the internet (Hugging Face hub) or from a local ``weights`` file; offline
without one, loading fails with one line saying so. ``weights`` may also be a Hub file,
``hf-hub:<owner>/<repo>[@<revision>]/<file>`` (fetched with huggingface_hub, see
:mod:`advtransfer.models.hub`), and ``sha256`` pins the bytes of either kind. ``random_init: true`` builds the architecture
at random initialisation, for wiring tests only (the card then says ``kind: random_init``; such
a model must never be used for reported numbers). ``model_config`` registers an open_clip
architecture given inline (a tiny one for tests).

``cifar_hub`` entries take pixels in [0,1], N×3×32×32, and normalise inside with the collection's
own mean/std (see :mod:`advtransfer.models.cifar_hub`). Their weights are pinned by the release URL
and the 8-hex sha256 prefix in its file name: downloaded with
``torch.hub.load_state_dict_from_url(url, check_hash=True, weights_only=True)`` (a file already in
torch.hub's cache is checked against the prefix first), or read from a local ``weights`` file whose
sha256 must start with the prefix, with ``torch.load(..., weights_only=True)``; the state dict
loads with strict keys.

``robustbench`` entries need the ``robustbench`` package (not a dependency of advtransfer; ``pip
install git+https://github.com/RobustBench/robustbench.git``) and are loaded with
``robustbench.utils.load_model(model_name, model_dir, dataset, threat_model)``, which downloads the
checkpoint (from Google Drive; a few models through timm) into
``<cache>/robustbench/<dataset>/<threat model>/<name>.pt``. They take pixels in [0,1] already.
They are pinned by model name, dataset and threat model only (the identity hashed into the card):
RobustBench (as of its commit 78fcc9e) does not verify a checksum of model checkpoints, and the
file is read by RobustBench's own ``torch.load`` call, outside this module's control. Offline, put
the checkpoint at that path; a ``weights:`` key is refused for these entries. Their ``random_init``
(RobustBench's architecture constructor, no weights) is untested here: the package is not
importable on this project's test machines.
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

from ..core.errors import UserError

LOADERS = ("open_clip", "timm", "cifar_hub", "robustbench")
ROBUSTBENCH_INSTALL = "pip install git+https://github.com/RobustBench/robustbench.git"
ROBUSTBENCH_THREATS = ("Linf", "L2", "corruptions")
PRETRAINED_KEYS = {"tag", "weights", "sha256", "random_init", "templates", "model_config"}

# The 18 CIFAR prompt templates of the CLIP paper's zero-shot evaluation.
CIFAR_TEMPLATES = tuple(
    f"a {q}photo of {a} {{}}." for a in ("a", "the")
    for q in ("", "blurry ", "black and white ", "low contrast ", "high contrast ", "bad ", "good ")
) + tuple(f"a photo of {a} {s} {{}}." for a in ("a", "the") for s in ("small", "big"))


def loader_of(arch: str) -> tuple[str, str]:
    """``open_clip/ViT-B-32`` → (``open_clip``, ``ViT-B-32``); a name without a prefix is an
    architecture of the registry (the harness's, or a plugin's: ``mynet`` → (``arch``, ``mynet``),
    its own weights from a file); raises for another prefix."""
    if isinstance(arch, str) and arch and "/" not in arch:
        return "arch", arch
    kind, _, name = arch.partition("/")
    if kind not in LOADERS or not name:
        raise UserError(f"pretrained entry arch {arch!r} must be open_clip/<architecture>, timm/<model>, "
                        f"cifar_hub/<model> or robustbench/<model name>")
    return kind, name


def check_entry(name: str, arch: str, pretrained: Any, source: str) -> None:
    """Validate the ``pretrained:`` block of a zoo entry (one-line errors)."""
    if not isinstance(pretrained, dict):
        raise UserError(f"{source}: model {name!r}: pretrained must be a mapping like {{tag: ..., weights: ...}}")
    extra = set(pretrained) - PRETRAINED_KEYS
    if extra:
        raise UserError(f"{source}: model {name!r}: unknown pretrained keys {sorted(extra)}; allowed: {sorted(PRETRAINED_KEYS)}")
    kind, model = loader_of(arch)
    if kind == "arch" and pretrained.get("tag"):
        raise UserError(f"{source}: model {name!r}: arch {arch} is a registered architecture; its pretrained "
                        f"entry takes weights: (a state-dict file) or random_init: true, not a tag")
    if not (pretrained.get("tag") or pretrained.get("weights") or pretrained.get("random_init")):
        raise UserError(f"{source}: model {name!r}: pretrained needs a tag, a weights file or random_init: true")
    from .hub import is_hub_ref, parse_hub_ref

    if is_hub_ref(pretrained.get("weights")):
        try:
            parse_hub_ref(pretrained["weights"])
        except UserError as exc:
            raise UserError(f"{source}: model {name!r}: {exc}") from None
    sha = pretrained.get("sha256")
    if sha is not None and not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
        raise UserError(f"{source}: model {name!r}: pretrained sha256 must be 64 lowercase hex digits, got {sha!r}")
    if kind == "cifar_hub":
        from . import cifar_hub

        try:
            pin = cifar_hub.get(model).sha256_prefix
        except UserError as exc:
            raise UserError(f"{source}: model {name!r}: {exc}") from None
        tag = pretrained.get("tag")
        if tag is not None and tag != pin:  # a string: YAML reads 57191229 as a number
            raise UserError(f"{source}: model {name!r}: {arch} is pinned to sha256 prefix {pin} "
                            f"(file {cifar_hub.get(model).file_name}); its tag {tag!r} differs "
                            f"(omit it or write tag: \"{pin}\", quoted)")
    elif kind == "robustbench":
        if pretrained.get("weights"):
            raise UserError(f"{source}: model {name!r}: robustbench entries take no weights: file; RobustBench reads "
                            f"its checkpoint from <cache>/robustbench/<dataset>/<threat model>/{model}.pt")
        if pretrained.get("tag", "Linf") not in ROBUSTBENCH_THREATS:
            raise UserError(f"{source}: model {name!r}: a robustbench tag is the threat model, one of "
                            f"{', '.join(ROBUSTBENCH_THREATS)}; got {pretrained.get('tag')!r}")


def _block(spec) -> dict:
    """The entry's ``pretrained:`` mapping (its :class:`~.catalogue.Origin`'s value)."""
    return spec.origin.value


def weights_file(spec) -> str | None:
    """The entry's local weights file: a path, or ``hf-hub:...`` fetched from the Hugging Face Hub
    (see :mod:`.hub`); checked against the entry's ``sha256`` when it gives one."""
    from .hub import hub_file, is_hub_ref

    w = _block(spec).get("weights")
    if not w:
        return None
    sha = _block(spec).get("sha256")
    if is_hub_ref(w):
        return str(hub_file(w, sha, f"model {spec.name!r}: weights"))
    path = Path(os.path.expandvars(str(w))).expanduser()
    if sha and path.is_file():
        from ..core.utils import sha256_file

        if sha256_file(path) != sha:
            raise UserError(f"model {spec.name!r}: weights file {str(path)!r} does not match the sha256 "
                            f"{sha[:12]}... of its entry ({spec.source})")
    if not path.is_file():
        raise UserError(f"model {spec.name!r}: weights file {str(path)!r} does not exist ({spec.source})")
    return str(path)


def _offline_error(spec, exc: Exception) -> UserError:
    tag = _block(spec).get("tag")
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
    t = _block(spec).get("templates", "cifar10" if spec.dataset == "cifar10" else "imagenet")
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

    def encode_image(self, x: torch.Tensor) -> torch.Tensor:
        """Unit-norm image embeddings (N×D) of pixels x in [0,1] (N×3×H×W, any size)."""
        if tuple(x.shape[-2:]) != self.image_size:
            x = F.interpolate(x, size=self.image_size, mode=self.interpolation, align_corners=False)
        return F.normalize(self.visual((x - self.mean) / self.std), dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logit_scale * self.encode_image(x) @ self.head

    def attach_text(self, model: nn.Module, tokenizer, class_names: Sequence[str]) -> None:
        """Keep the text tower for prompt learning (:meth:`prompt_text_features`), outside the
        module's parameters and state dict (the zero-shot classifier stays image tower + head)."""
        self.__dict__["_text"] = (model, tokenizer, list(class_names))

    @property
    def has_text(self) -> bool:
        return "_text" in self.__dict__

    def context_init(self, n_ctx: int, init: str = "a photo of a") -> torch.Tensor:
        """Token embeddings (n_ctx×W) to start learned prompt context from: the words of ``init``
        when it has n_ctx tokens, else small random vectors (CoOp's initialisation)."""
        model, tok, _ = self.__dict__["_text"]
        ids = tok([init])[0]
        words = ids[1:int(ids.argmax())]  # between start and end tokens
        emb = model.token_embedding.weight
        if len(words) == n_ctx:
            return emb[words].detach().clone()
        return torch.randn(n_ctx, emb.shape[1], generator=torch.Generator().manual_seed(0)).to(emb) * 0.02

    def prompt_text_features(self, ctx: torch.Tensor) -> torch.Tensor:
        """Unit-norm text embeddings (classes×D) of the prompts [ctx_1 … ctx_M] [class name].
        (CoOp, Zhou et al. 2022): ``ctx`` (M×W token embeddings) is spliced in after the start token;
        differentiable in ``ctx`` (the text tower stays frozen)."""
        model, tok, names = self.__dict__["_text"]
        m = ctx.shape[0]
        ids = tok([" ".join(["X"] * m) + " " + n + "." for n in names]).to(ctx.device)
        emb = model.token_embedding(ids).to(ctx.dtype)
        emb = torch.cat([emb[:, :1], ctx[None].expand(len(names), -1, -1), emb[:, 1 + m:]], 1)
        x = emb + model.positional_embedding.to(ctx.dtype)
        x = model.ln_final(model.transformer(x, attn_mask=model.attn_mask))
        x = x[torch.arange(len(names), device=x.device), ids.argmax(-1)]
        proj = model.text_projection
        x = proj(x) if isinstance(proj, nn.Linear) else x @ proj
        return F.normalize(x, dim=-1)


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

    cfg = _block(spec).get("model_config")
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
    weights = weights_file(spec)
    random_init = bool(_block(spec).get("random_init"))
    pretrained = None if random_init else (weights or _block(spec).get("tag"))
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
    if getattr(model, "token_embedding", None) is not None:  # CLIP models with open_clip's own text tower
        for p in model.parameters():
            p.requires_grad_(False)
        wrapped.attach_text(model, tokenizer, class_names(spec.dataset, spec.num_classes))
    return wrapped


def build_timm(spec, device: str = "cpu") -> TimmPreprocessed:
    import timm

    _, arch = loader_of(spec.arch)
    tag = _block(spec).get("tag")
    name = f"{arch}.{tag}" if tag and "." not in arch else arch
    weights = weights_file(spec)
    random_init = bool(_block(spec).get("random_init"))
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


def _first_line(exc: BaseException) -> str:
    return next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)


def _check_prefix(path: str | os.PathLike, entry, what: str) -> None:
    """The sha256 of ``path`` must start with ``entry``'s pinned prefix (one-line UserError)."""
    from ..core.utils import sha256_file

    digest = sha256_file(path)
    if not digest.startswith(entry.sha256_prefix):
        raise UserError(f"{what} {str(path)!r} has sha256 {digest[:16]}..., not the pinned prefix "
                        f"{entry.sha256_prefix} of {entry.file_name}; it is another file (replace it with "
                        f"{entry.url})")


def _hub_state(spec, entry) -> dict:
    """The released state dict of a cifar_hub entry: downloaded (sha256 prefix checked by
    torch.hub) or read from torch.hub's cache (checked here first)."""
    cached = Path(torch.hub.get_dir()) / "checkpoints" / entry.file_name
    if cached.is_file():
        _check_prefix(cached, entry, f"model {spec.name!r}: torch.hub's cached file")
    try:
        return torch.hub.load_state_dict_from_url(entry.url, map_location="cpu", check_hash=True, weights_only=True)
    except UserError:
        raise
    except RuntimeError as exc:
        if "invalid hash value" in str(exc):
            raise UserError(f"model {spec.name!r}: the file downloaded from {entry.url} does not have the pinned "
                            f"sha256 prefix {entry.sha256_prefix} ({_first_line(exc)})") from None
        raise UserError(f"model {spec.name!r}: cannot load {entry.url} "
                        f"({type(exc).__name__}: {_first_line(exc)})") from None
    except Exception as exc:  # no network, DNS failure, HTTP error
        raise UserError(f"model {spec.name!r}: cannot download {entry.url} ({type(exc).__name__}; no internet?); "
                        f"run once with internet, or download that file and give it as `weights:` "
                        f"in {spec.source}") from None


def build_cifar_hub(spec, device: str = "cpu") -> nn.Module:
    """A chenyaofo/pytorch-cifar-models CIFAR-10 model taking pixels in [0,1] (see the module docstring)."""
    from . import cifar_hub

    _, arch = loader_of(spec.arch)
    entry = cifar_hub.get(arch)
    if spec.dataset != "cifar10" or spec.num_classes != 10:
        raise UserError(f"model {spec.name!r}: {spec.arch} is a CIFAR-10 model (dataset: cifar10, num_classes: 10)")
    model = cifar_hub.build(arch, 10)
    if _block(spec).get("random_init"):
        return model
    weights = weights_file(spec)
    if weights:
        _check_prefix(weights, entry, f"model {spec.name!r}: weights file")
        try:
            state = torch.load(weights, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise UserError(f"model {spec.name!r}: weights file {weights!r} cannot be read with "
                            f"torch.load(weights_only=True) ({type(exc).__name__}: {_first_line(exc)})") from None
        where = f"model {spec.name!r}: weights file {weights!r}"
    else:
        state = _hub_state(spec, entry)
        where = f"model {spec.name!r}: {entry.url}"
    cifar_hub.load_state(model, state, where)
    return model


def _robustbench_dir() -> Path:
    from ..core.config import cache_dir

    return cache_dir() / "robustbench"


def build_robustbench(spec, device: str = "cpu") -> nn.Module:
    """A RobustBench model (pixels in [0,1]) through ``robustbench.utils.load_model``; with
    ``random_init`` its architecture from RobustBench's model zoo, without weights."""
    _, name = loader_of(spec.arch)
    threat = _block(spec).get("tag") or "Linf"
    try:
        from robustbench.utils import load_model as robustbench_load
    except ImportError as exc:  # missing, or installed without its own dependencies
        raise UserError(f"model {spec.name!r}: {spec.arch} needs the robustbench package, which cannot be imported "
                        f"({type(exc).__name__}: {_first_line(exc)}); install it with `{ROBUSTBENCH_INSTALL}` "
                        f"(not a dependency of advtransfer)") from None
    if _block(spec).get("random_init"):
        from robustbench.model_zoo import model_dicts
        from robustbench.model_zoo.enums import BenchmarkDataset, ThreatModel

        try:
            return model_dicts[BenchmarkDataset(spec.dataset)][ThreatModel(threat)][name]["model"]()
        except (KeyError, ValueError):
            raise UserError(f"model {spec.name!r}: RobustBench has no {spec.dataset} {threat} architecture "
                            f"constructor for {name!r}") from None
    target = _robustbench_dir() / spec.dataset / threat / f"{name}.pt"
    try:
        return robustbench_load(model_name=name, model_dir=str(_robustbench_dir()), dataset=spec.dataset,
                                threat_model=threat)
    except KeyError:
        raise UserError(f"model {spec.name!r}: RobustBench has no {spec.dataset} {threat} model {name!r} "
                        f"(see robustbench.model_zoo)") from None
    except Exception as exc:  # download failed (no internet) or an unreadable checkpoint
        raise UserError(f"model {spec.name!r}: RobustBench could not load {name!r} ({type(exc).__name__}: "
                        f"{_first_line(exc)}); it needs internet on first use, or its checkpoint at "
                        f"{str(target)!r}") from None


def build_registered(spec, device: str = "cpu") -> nn.Module:
    """A registered architecture (``arch: mynet``, a plugin's or the harness's) with the user's
    own weights: the network wrapped to take pixels in [0,1] and normalise inside (as the zoo's
    trained entries), its state dict read from ``weights`` (safetensors, or a torch file read with
    ``weights_only=True``): the network's own keys, or the wrapped model's (``net.``-prefixed, as
    the harness saves them)."""
    from .archs import CIFAR10_MEAN, CIFAR10_STD, ImageClassifier, build_arch

    model = ImageClassifier(build_arch(spec.arch, num_classes=spec.num_classes, **spec.arch_kwargs),
                            CIFAR10_MEAN, CIFAR10_STD)
    weights = weights_file(spec)
    if weights is None:
        return model
    try:
        if weights.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(weights)
        else:
            state = torch.load(weights, map_location="cpu", weights_only=True)
        if not isinstance(state, dict):
            raise TypeError(f"holds a {type(state).__name__}, not a state dict")
        target = model if state and all(str(k).startswith("net.") for k in state) else model.net
        target.load_state_dict(state, strict=True)
    except Exception as exc:  # unreadable, or keys/shapes that do not match the architecture
        raise UserError(f"model {spec.name!r}: weights file {weights!r} does not load into arch {spec.arch} "
                        f"({type(exc).__name__}: {_first_line(exc)})") from None
    return model


_BUILDERS = {"arch": build_registered, "open_clip": build_open_clip, "timm": build_timm, "cifar_hub": build_cifar_hub,
             "robustbench": build_robustbench}


def build_pretrained(spec, device: str = "cpu") -> nn.Module:
    """The eval-mode module of a pretrained entry (weights frozen); see the module docstring.
    Torch's global random state is left unchanged (building initialises weights at random before
    loading any); a ``random_init`` entry is initialised from seed 0, for reproducible wiring tests."""
    from ..core.rng import seeded

    kind, _ = loader_of(spec.arch)
    with seeded(0 if _block(spec).get("random_init") else None, device):
        model = _BUILDERS[kind](spec, device)
    model.eval().to(device)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def identity(spec) -> dict:
    """What determines a pretrained entry's weights (hashed into its card's recipe_hash); for
    cifar_hub the release URL and pinned sha256 prefix, for robustbench the model it names."""
    ident = {"arch": spec.arch, "arch_kwargs": spec.arch_kwargs, "dataset": spec.dataset,
             "num_classes": spec.num_classes, "pretrained": _block(spec)}
    kind, name = loader_of(spec.arch)
    if kind == "cifar_hub":
        from . import cifar_hub

        entry = cifar_hub.get(name)
        ident["release"] = {"url": entry.url, "sha256_prefix": entry.sha256_prefix}
    elif kind == "robustbench":
        ident["robustbench"] = {"model_name": name, "dataset": spec.dataset,
                                "threat_model": _block(spec).get("tag") or "Linf"}
    elif kind == "arch":
        from .archs import ARCHS

        sha = ARCHS.code(name)
        if sha:  # a plugin's architecture: its source's sha256
            ident["plugin_code"] = {"architecture": sha}
    return ident
