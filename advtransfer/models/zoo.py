"""The model zoo: declarative entries in ``surrogates/*.yaml`` and ``victims/*.yaml``, trained on
demand into the cache as safetensors weights plus a JSON card.

Cache layout: ``$ADVTRANSFER_CACHE/zoo/<size>/<name>.safetensors`` and ``<name>.json``. The card
holds the architecture, the resolved recipe and its hash, clean accuracy on test images 0–999,
training time and the sha256 of the weights; :func:`load_model` verifies that checksum.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
import torch.nn as nn
import yaml

from ..config import SIZES, cache_dir, default_size
from ..errors import UserError
from ..registry import suggest
from ..utils import atomic_path, atomic_write_text, sha256_file, short_hash
from .archs import CIFAR10_MEAN, CIFAR10_STD, ImageClassifier, build_arch

REPO_ROOT = Path(__file__).resolve().parents[2]
CARD_VERSION = 1


@dataclass(frozen=True)
class ModelSpec:
    """One zoo entry. ``recipe`` holds the training recipe with its ``sizes`` (ci/cpu/full)."""

    name: str
    arch: str
    family: str
    recipe: dict
    arch_kwargs: dict = field(default_factory=dict)
    dataset: str = "cifar10"
    num_classes: int = 10
    kind: str = "single"
    channels_last: bool = True
    pretrained: dict | None = None  # open_clip / timm pretrained entry (not trained): see models/pretrained.py
    source: str = ""

    def resolved_recipe(self, size: str) -> dict:
        """The recipe for one size: the shared keys updated with ``sizes[size]``."""
        if size not in SIZES:
            raise UserError(f"unknown zoo size {size!r}; use one of {', '.join(SIZES)}")
        base = {k: v for k, v in self.recipe.items() if k != "sizes"}
        sizes = self.recipe.get("sizes", {})
        if size not in sizes:
            raise UserError(f"model {self.name!r} ({self.source}) has no recipe for size {size!r}")
        base.update(sizes[size])
        return base

    def identity(self, size: str) -> dict:
        """Everything that determines the trained weights (hashed into ``recipe_hash``); for a
        recipe continuing from another entry (``init_from``) that entry's hash too; for a
        pretrained entry its source (architecture, tag or weights file)."""
        if self.pretrained is not None:
            from .pretrained import identity

            return identity(self)
        ident = {"arch": self.arch, "arch_kwargs": self.arch_kwargs, "dataset": self.dataset,
                 "num_classes": self.num_classes, "recipe": self.resolved_recipe(size)}
        base = ident["recipe"].get("init_from")
        if base:
            ident["init_from_hash"] = get_spec(base).recipe_hash(size)
        return ident

    def recipe_hash(self, size: str) -> str:
        return short_hash(self.identity(size))

    def build(self) -> ImageClassifier:
        """A freshly initialised network wrapped to take pixels in [0,1]."""
        seed = int(self.recipe.get("seed", 0))
        torch.manual_seed(seed)
        net = build_arch(self.arch, num_classes=self.num_classes, **self.arch_kwargs)
        cl = self.channels_last and not self.arch.startswith("vit")
        return ImageClassifier(net, CIFAR10_MEAN, CIFAR10_STD, channels_last=cl)


_REQUIRED = ("name", "arch", "family", "recipe")


def _spec_from_entry(entry: Any, source: str) -> ModelSpec:
    if not isinstance(entry, dict):
        raise UserError(f"{source}: each model entry must be a mapping, got {type(entry).__name__}")
    missing = [k for k in _REQUIRED if k not in entry]
    if "pretrained" in entry:  # not trained by the harness: no recipe
        missing = [k for k in ("name", "arch", "family") if k not in entry]
        entry = {"recipe": {}, "kind": "pretrained", **entry}
    if missing:
        raise UserError(f"{source}: model entry {entry.get('name', '?')!r} lacks {', '.join(missing)}")
    known = set(ModelSpec.__dataclass_fields__) - {"source"}
    extra = set(entry) - known
    if extra:
        raise UserError(f"{source}: model {entry['name']!r} has unknown keys {sorted(extra)}; "
                        f"allowed: {sorted(known)}")
    if "pretrained" in entry:
        from .pretrained import check_entry

        check_entry(entry["name"], entry["arch"], entry["pretrained"], source)
    elif not isinstance(entry["recipe"], dict) or "sizes" not in entry["recipe"]:
        raise UserError(f"{source}: model {entry['name']!r} needs recipe.sizes with ci/cpu/full")
    return ModelSpec(**{k: entry[k] for k in entry}, source=source)


def zoo_dirs() -> list[Path]:
    """Folders holding model YAML files: $ADVTRANSFER_ZOO (os.pathsep-separated), else the
    repository's ``surrogates/`` and ``victims/``."""
    env = os.environ.get("ADVTRANSFER_ZOO")
    if env:
        return [Path(p) for p in env.split(os.pathsep) if p]
    return [REPO_ROOT / "surrogates", REPO_ROOT / "victims"]


def load_specs(dirs: Iterable[Path] | None = None) -> dict[str, ModelSpec]:
    """All model entries of the zoo folders, by name (names are unique across files)."""
    specs: dict[str, ModelSpec] = {}
    for d in dirs or zoo_dirs():
        for path in sorted(Path(d).glob("*.yaml")):
            try:
                doc = yaml.safe_load(path.read_text())
            except yaml.YAMLError as exc:
                raise UserError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
            entries = (doc or {}).get("models", []) if isinstance(doc, dict) else None
            if not isinstance(entries, list):
                raise UserError(f"{path}: expected a top-level 'models:' list")
            for entry in entries:
                spec = _spec_from_entry(entry, str(path))
                if spec.name in specs:
                    raise UserError(f"model {spec.name!r} is declared twice ({specs[spec.name].source}, {path})")
                specs[spec.name] = spec
    return specs


def split_checkpoint(name: str) -> tuple[str, int | None]:
    """``'resnet20_std@epoch2'`` → ``('resnet20_std', 2)``; a plain name → ``(name, None)``."""
    base, sep, tail = name.partition("@")
    if not sep:
        return name, None
    if not (tail.startswith("epoch") and tail[5:].isdigit()):
        raise UserError(f"model {name!r}: a checkpoint is named <entry>@epoch<k>, like resnet20_std@epoch2")
    return base, int(tail[5:])


def get_spec(name: str, specs: dict[str, ModelSpec] | None = None) -> ModelSpec:
    """The entry ``name``; ``<entry>@epoch<k>`` is the checkpoint kept after epoch k of a recipe
    with ``keep_epochs`` (kind ``es``, early stopping), trained together with its entry."""
    specs = load_specs() if specs is None else specs
    base, epoch = split_checkpoint(name)
    if epoch is not None:
        return replace(get_spec(base, specs), name=name, kind="es")
    if name not in specs:
        raise UserError(suggest(name, list(specs), "model") + "; models are declared in surrogates/*.yaml and victims/*.yaml")
    return specs[name]


def _paths(name: str, size: str, cache: str | os.PathLike | None) -> tuple[Path, Path]:
    root = cache_dir(cache) / "zoo" / size
    return root / f"{name}.safetensors", root / f"{name}.json"


def read_card(name: str, size: str | None = None, cache: str | os.PathLike | None = None) -> dict | None:
    """The JSON card of a trained model, or None if it is not trained (at this size)."""
    _, card_path = _paths(name, size or default_size(), cache)
    if not card_path.is_file():
        return None
    try:
        return json.loads(card_path.read_text())
    except json.JSONDecodeError:
        raise UserError(f"model card {card_path} is corrupt; delete it and run `advtransfer zoo train`") from None


def is_trained(spec: ModelSpec, size: str, cache: str | os.PathLike | None = None) -> bool:
    """Trained (or, for a pretrained entry, loaded once and carded) with the current recipe."""
    card = read_card(spec.name, size, cache)
    weights, _ = _paths(spec.name, size, cache)
    ready = spec.pretrained is not None or weights.is_file()
    return card is not None and card.get("recipe_hash") == spec.recipe_hash(size) and ready


def prepare_pretrained(spec: ModelSpec, size: str | None = None, cache: str | os.PathLike | None = None,
                       data_dir: str | os.PathLike | None = None, device: str = "cpu") -> dict:
    """Load a pretrained entry once (downloading its weights, or failing with one line offline),
    measure its clean accuracy on test images 0-999 where the dataset has a test split, and write
    its card; returns the card."""
    from ..data import eval_subset, load_dataset
    from ..training.base import accuracy
    from ..utils import versions
    from .pretrained import build_pretrained

    size = size or default_size()
    t0 = time.perf_counter()
    model = build_pretrained(spec, device)
    load_s = time.perf_counter() - t0
    acc, images = None, None
    try:
        test = load_dataset(spec.dataset, "test", data_dir)
        x, y, _ = eval_subset(test, min(1000, len(test)))
        acc, images = accuracy(model, x, y, device=device), f"test 0-{len(x) - 1}"
    except UserError:
        pass
    weights = spec.pretrained.get("weights")
    card = {
        "card_version": CARD_VERSION, "name": spec.name, "arch": spec.arch, "arch_kwargs": spec.arch_kwargs,
        "family": spec.family, "kind": "random_init" if spec.pretrained.get("random_init") else "pretrained",
        "dataset": spec.dataset, "size": size, "pretrained": spec.pretrained, "recipe": None,
        "recipe_hash": spec.recipe_hash(size), "members": [""], "clean_acc": acc, "clean_acc_images": images,
        "train_s": 0.0, "load_s": round(load_s, 2),
        # the checksum of a local weights file, else of the entry (hub weights are pinned by their tag)
        "sha256": sha256_file(Path(os.path.expandvars(weights)).expanduser()) if weights else spec.recipe_hash(size),
        "n_params": sum(p.numel() for p in model.parameters()), "versions": versions(),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": device,
    }
    _, card_path = _paths(spec.name, size, cache)
    atomic_write_text(card_path, json.dumps(card, indent=2, default=float))
    return card


def _state_to_flat(states: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    if list(states) == [""]:
        return {k: v.contiguous() for k, v in states[""].items()}
    return {f"{m}/{k}": v.contiguous() for m, sd in states.items() for k, v in sd.items()}


def _flat_to_states(flat: dict[str, torch.Tensor], members: Sequence[str]) -> dict[str, dict[str, torch.Tensor]]:
    if list(members) == [""]:
        return {"": flat}
    out: dict[str, dict[str, torch.Tensor]] = {m: {} for m in members}
    for k, v in flat.items():
        m, _, key = k.partition("/")
        if m not in out:
            raise UserError(f"checkpoint holds an unexpected member {m!r}")
        out[m][key] = v
    return out


def train_spec(spec: ModelSpec, size: str | None = None, cache: str | os.PathLike | None = None,
               data_dir: str | os.PathLike | None = None, device: str = "cpu", progress: bool = True) -> dict:
    """Train one zoo entry at ``size`` and write its weights and card atomically; returns the card."""
    from safetensors.torch import save_file

    from ..data import eval_subset, load_dataset
    from ..training import train_from_recipe
    from ..training.base import accuracy
    from ..utils import versions

    size = size or default_size()
    base, epoch = split_checkpoint(spec.name)
    if epoch is not None:  # a checkpoint is written by training its entry
        if not is_trained(get_spec(base), size, cache):
            train_spec(get_spec(base), size, cache, data_dir, device, progress)
        card = read_card(spec.name, size, cache)
        if card is None:
            raise UserError(f"{spec.name!r}: entry {base!r} keeps no checkpoint after epoch {epoch}; "
                            f"add {epoch} to its recipe's keep_epochs")
        return card
    recipe = dict(spec.resolved_recipe(size), _name=spec.name)
    train = load_dataset(spec.dataset, "train", data_dir)
    test = load_dataset(spec.dataset, "test", data_dir)
    net = spec.build()
    if recipe.get("init_from"):
        ensure_trained([recipe["init_from"]], size, cache, data_dir, device, progress)
        start = load_model(recipe["init_from"], size, cache)
        net.load_state_dict(start.state_dict())
    t0 = time.perf_counter()
    out = train_from_recipe(net, recipe, train, device, progress)
    train_s = time.perf_counter() - t0
    x, y, _ = eval_subset(test, min(1000, len(test)))
    accs = {}
    for member in out.meta.get("model_members", list(out.states)):
        net.load_state_dict(out.states[member])
        accs[member] = accuracy(net.to(device), x, y, device=device)
    weights, card_path = _paths(spec.name, size, cache)
    epochs_kept = _write_checkpoints(spec, size, cache, out, net, x, y, device)
    with atomic_path(weights) as tmp:
        save_file(_state_to_flat(out.states), str(tmp))
    recipe.pop("_name")
    card = {
        "card_version": CARD_VERSION, "name": spec.name, "arch": spec.arch, "arch_kwargs": spec.arch_kwargs,
        "family": spec.family, "kind": spec.kind, "dataset": spec.dataset, "size": size,
        "recipe": recipe, "recipe_hash": spec.recipe_hash(size),
        "members": list(out.states), "clean_acc": sum(accs.values()) / len(accs),
        "clean_acc_members": accs if list(accs) != [""] else None, "clean_acc_images": "test 0-999",
        "train_s": round(train_s, 2), "sha256": sha256_file(weights),
        "n_params": sum(p.numel() for p in net.parameters()), "meta": out.meta,
        "surrogate_params": out.meta.get("surrogate_params", {}), "epochs_kept": epochs_kept,
        "versions": versions(), "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": device,
    }
    atomic_write_text(card_path, json.dumps(card, indent=2, default=float))
    return card


def _write_checkpoints(spec: ModelSpec, size: str, cache, out, net: nn.Module, x, y, device: str) -> list[int]:
    """Store ``out.checkpoints`` as entries ``<name>@epoch<k>`` (weights + card of kind ``es``)."""
    from safetensors.torch import save_file

    from ..training.base import accuracy
    from ..utils import versions

    kept = []
    for key, sd in out.checkpoints.items():
        epoch = int(key[len("epoch"):])
        name = f"{spec.name}@{key}"
        net.load_state_dict(sd)
        weights, card_path = _paths(name, size, cache)
        with atomic_path(weights) as tmp:
            save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp))
        epochs = int(spec.resolved_recipe(size)["epochs"])
        card = {
            "card_version": CARD_VERSION, "name": name, "arch": spec.arch, "arch_kwargs": spec.arch_kwargs,
            "family": spec.family, "kind": "es", "dataset": spec.dataset, "size": size,
            "recipe": spec.resolved_recipe(size), "recipe_hash": spec.recipe_hash(size), "members": [""],
            "clean_acc": accuracy(net.to(device), x, y, device=device), "clean_acc_members": None,
            "clean_acc_images": "test 0-999", "sha256": sha256_file(weights), "checkpoint_of": spec.name,
            "surrogate_params": {"epoch": epoch, "epochs": epochs, **{k: v for k, v in out.meta.get(
                "surrogate_params", {}).items() if k != "epochs"}},
            "versions": versions(), "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "device": device,
        }
        atomic_write_text(card_path, json.dumps(card, indent=2, default=float))
        kept.append(epoch)
    return sorted(kept)


def ensure_trained(names: Iterable[str], size: str | None = None, cache: str | os.PathLike | None = None,
                   data_dir: str | os.PathLike | None = None, device: str = "cpu", progress: bool = True,
                   log=print) -> list[dict]:
    """Train those of ``names`` (with the models they depend on) that are missing or stale."""
    size = size or default_size()
    specs = load_specs()
    cards = []
    for name in dict.fromkeys(names):
        spec = get_spec(name, specs)
        if spec.pretrained is not None and not is_trained(spec, size, cache):
            log(f"loading pretrained {name} ({spec.arch}) ...")
            prepare_pretrained(spec, size, cache, data_dir, device)
        elif not is_trained(spec, size, cache):
            log(f"training {name} ({spec.arch}, size {size}) ...")
            card = train_spec(spec, size, cache, data_dir, device, progress)
            log(f"  {name}: clean accuracy {card['clean_acc']:.3f} on test 0-999, {card['train_s']:.0f} s")
        cards.append(read_card(name, size, cache))
    return cards


def load_states(name: str, size: str | None = None, cache: str | os.PathLike | None = None
                ) -> tuple[ModelSpec, dict, dict[str, dict[str, torch.Tensor]]]:
    """Spec, card and verified weights of a trained model."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    size = size or default_size()
    spec = get_spec(name)
    weights, _ = _paths(name, size, cache)
    card = read_card(name, size, cache)
    if card is None or not weights.is_file():
        raise UserError(f"model {name!r} is not trained at size {size!r}; run `advtransfer zoo train {name}`")
    if card.get("recipe_hash") != spec.recipe_hash(size):
        raise UserError(f"model {name!r} in the cache was trained with another recipe; "
                        f"run `advtransfer zoo train {name}` to retrain it")
    if sha256_file(weights) != card.get("sha256"):
        raise UserError(f"checkpoint {weights} does not match its card's sha256 (corrupt or replaced); "
                        f"delete it and run `advtransfer zoo train {name}`")
    try:
        flat = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as exc:
        raise UserError(f"checkpoint {weights} cannot be read ({exc}); delete it and retrain") from None
    return spec, card, _flat_to_states(flat, card.get("members", [""]))


def instantiate(spec: ModelSpec, state: dict[str, torch.Tensor], where: str = "") -> ImageClassifier:
    """Build ``spec``'s network and load ``state`` into it (eval mode, gradients off for weights)."""
    net = spec.build()
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise UserError(f"checkpoint {where or spec.name} does not fit architecture {spec.arch!r} "
                        f"({first}); it is foreign or stale: delete it and retrain") from None
    net.eval()
    for p in net.parameters():
        p.requires_grad_(False)
    return net


def load_model(name: str, size: str | None = None, cache: str | os.PathLike | None = None,
               device: str = "cpu") -> nn.Module:
    """Load a trained zoo model: an eval-mode ``nn.Module`` taking pixels in [0,1] (N×3×32×32),
    returning logits; the weights' sha256 is checked against the card.

    For a collection (several weight sets) this returns its first member; use
    :func:`load_members` for all of them. A pretrained entry (open_clip, timm) is built from its
    hub tag or local weights file and takes pixels in [0,1] at any size.
    """
    spec = get_spec(name)
    if spec.pretrained is not None:
        from .pretrained import build_pretrained

        return build_pretrained(spec, device)
    spec, _card, states = load_states(name, size, cache)
    member = next(iter(states))
    return instantiate(spec, states[member], name).to(device)


def load_members(name: str, size: str | None = None, cache: str | os.PathLike | None = None,
                 device: str = "cpu") -> list[nn.Module]:
    """All weight sets of a zoo entry as eval-mode modules (one for a single model)."""
    if get_spec(name).pretrained is not None:
        return [load_model(name, size, cache, device)]
    spec, _card, states = load_states(name, size, cache)
    return [instantiate(spec, sd, f"{name}[{m}]").to(device) for m, sd in states.items()]
