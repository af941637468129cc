"""Getting zoo models: training entries on demand (:func:`ensure_trained`, :func:`train_spec`),
loading pretrained ones once to card them, defended ones around their base, and loading the
modules (:func:`load_model`, :func:`load_members`).

Nothing here changes torch's global random state: networks are initialised and trained under
:func:`advtransfer.rng.seeded`.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Iterable

import torch.nn as nn

from ..config import default_size
from ..errors import UserError
from ..utils import sha256_file
from .cards import make_card, read_card, write_card
from .catalogue import ModelSpec, get_spec, load_specs, split_checkpoint
from .loading import (FULL_TEST_SIZES, eval_images_label, eval_split, instantiate, load_networks, load_states,
                      whole_test_accuracy)
from .store import locate, save_states, shipped_hash, shipped_paths, verify_checksum, zoo_paths


def is_trained(spec: ModelSpec, size: str, cache: str | os.PathLike | None = None) -> bool:
    """Trained (or, for a pretrained entry, loaded once and carded) with the current recipe."""
    card = read_card(spec.name, size, cache)
    weights, _ = locate(spec.name, size, cache)
    if spec.defence is not None:  # current while its base is the same trained model
        base = read_card(spec.base, size, cache)
        return (card is not None and base is not None and card.get("recipe_hash") == spec.recipe_hash(size)
                and card.get("base_sha256") == base.get("sha256") and is_trained(get_spec(spec.base), size, cache))
    ready = spec.pretrained is not None or weights.is_file()
    return card is not None and card.get("recipe_hash") == spec.recipe_hash(size) and ready


def check_checkpoint(spec: ModelSpec, size: str, cache: str | os.PathLike | None = None) -> None:
    """A trained model's weights must still match the sha256 on its card; else a one-line
    UserError (checked before a run trains or writes anything: a corrupt checkpoint is refused,
    never loaded, and never silently retrained, which at full size could cost days)."""
    card = read_card(spec.name, size, cache) or {}
    weights, _ = locate(spec.name, size, cache)
    if spec.pretrained is not None or not weights.is_file():
        return
    verify_checksum(weights, card.get("sha256"), spec.name)


def prepare_pretrained(spec: ModelSpec, size: str | None = None, cache: str | os.PathLike | None = None,
                       data_dir: str | os.PathLike | None = None, device: str = "cpu") -> dict:
    """Load a pretrained entry once (downloading its weights, or failing with one line offline),
    measure its clean accuracy on test images 0-999 where the dataset has a test split, and write
    its card; returns the card."""
    from ..training.base import accuracy
    from .pretrained import build_pretrained

    size = size or default_size()
    t0 = time.perf_counter()
    model = build_pretrained(spec, device)
    load_s = time.perf_counter() - t0
    acc, images = None, None
    try:
        x, y = eval_split(spec.dataset, data_dir)
        acc, images = accuracy(model, x, y, device=device), f"test 0-{len(x) - 1}"
    except UserError:
        pass
    weights = spec.pretrained.get("weights")
    card = make_card(
        spec, size, kind="random_init" if spec.pretrained.get("random_init") else "pretrained",
        recipe=None, members=[""], clean_acc=acc, clean_acc_images=images,
        # the checksum of a local weights file, else of the entry (hub weights are pinned by their tag)
        sha256=sha256_file(Path(os.path.expandvars(weights)).expanduser()) if weights else spec.recipe_hash(size),
        n_params=sum(p.numel() for p in model.parameters()), device=device,
        pretrained=spec.pretrained, load_s=round(load_s, 2))
    write_card(card, cache)
    return card


def prepare_defended(spec: ModelSpec, size: str | None = None, cache: str | os.PathLike | None = None,
                     data_dir: str | os.PathLike | None = None, device: str = "cpu", progress: bool = True) -> dict:
    """Card a defended entry (a defence wrapping a trained base): train its base if needed,
    measure its clean accuracy (draw 0) on test images 0-999 and write the card; its ``sha256``
    hashes the base's weights checksum with the defence, so the victim checksum in every row
    changes with either. Returns the card."""
    import hashlib
    import json

    from ..metrics import labels
    from .defences import identity as defence_identity, resolve

    size = size or default_size()
    ensure_trained([spec.base], size, cache, data_dir, device, progress)
    base_card = read_card(spec.base, size, cache)
    defence = resolve(spec.defence, spec.source)
    model = load_model(spec.name, size, cache, device)
    x, y = eval_split(spec.dataset, data_dir)
    t0 = time.perf_counter()
    acc = float((labels(model, x, 500, device) == y).double().mean())
    sha = hashlib.sha256(f"{base_card['sha256']}|{json.dumps(defence_identity(defence), sort_keys=True)}"
                         .encode()).hexdigest()
    card = make_card(spec, size, kind="defended", recipe=None, members=[""], clean_acc=acc,
                     clean_acc_images=f"test 0-{len(x) - 1}", sha256=sha,
                     n_params=sum(p.numel() for p in model.parameters()), device=device,
                     base=spec.base, base_sha256=base_card["sha256"], base_clean_acc=base_card.get("clean_acc"),
                     defence=defence, eval_s=round(time.perf_counter() - t0, 2))
    write_card(card, cache)
    return card


def train_spec(spec: ModelSpec, size: str | None = None, cache: str | os.PathLike | None = None,
               data_dir: str | os.PathLike | None = None, device: str = "cpu", progress: bool = True) -> dict:
    """Train one zoo entry at ``size`` and write its weights and card atomically; returns the card.
    An ``<entry>@epoch<k>`` checkpoint is written by training its entry."""
    from ..data import load_dataset
    from ..training import train_from_recipe
    from ..training.base import accuracy

    size = size or default_size()
    base, epoch = split_checkpoint(spec.name)
    if epoch is not None:
        if not is_trained(get_spec(base), size, cache):
            train_spec(get_spec(base), size, cache, data_dir, device, progress)
        card = read_card(spec.name, size, cache)
        if card is None:
            raise UserError(f"{spec.name!r}: entry {base!r} keeps no checkpoint after epoch {epoch}; "
                            f"add {epoch} to its recipe's keep_epochs")
        return card
    recipe = dict(spec.resolved_recipe(size), _name=spec.name)
    variant = spec.data_variant(size)
    train = load_dataset(spec.dataset, "train", data_dir)
    if not variant.is_default:  # the declared source, balance, shift and label set
        from ..variants import apply_variant

        train = apply_variant(train, variant, recipe.get("train_subset"))
    net = spec.build(size)
    head_reset: list[str] = []
    if recipe.get("init_from"):
        ensure_trained([recipe["init_from"]], size, cache, data_dir, device, progress)
        head_reset = _load_start(net, load_model(recipe["init_from"], size, cache), spec, recipe["init_from"])
    from ..config import train_threads
    from ..rng import pinned_threads, provenance

    if recipe.get("sources"):  # static source models (ensemble_at, pubdef): trained first, frozen
        ensure_trained(list(recipe["sources"]), size, cache, data_dir, device, progress)
        recipe["_sources"] = {s: load_model(s, size, cache, device) for s in recipe["sources"]}
    threads = train_threads(recipe)
    t0 = time.perf_counter()
    with pinned_threads(threads):
        out = train_from_recipe(net, recipe, train, device, progress)
    train_s = time.perf_counter() - t0
    made_by = provenance(device, threads)
    recipe.pop("_name")
    recipe.pop("_sources", None)
    x, y = eval_split(spec.dataset, data_dir, variant)
    images = eval_images_label(x, variant)
    accs = {}
    for member in out.meta.get("model_members", list(out.states)):
        net.load_state_dict(out.states[member])
        accs[member] = accuracy(net.to(device), x, y, device=device)
    n_params = sum(p.numel() for p in net.parameters())
    params = out.meta.get("surrogate_params", {})
    kept = []
    for key, sd in out.checkpoints.items():  # early-stopped entries <name>@epoch<k> (kind es)
        k = int(key[len("epoch"):])
        net.load_state_dict(sd)
        name = f"{spec.name}@{key}"
        sha = save_states(zoo_paths(name, size, cache)[0], {"": sd})
        write_card(make_card(
            spec, size, name=name, kind="es", recipe=recipe, members=[""],
            clean_acc=accuracy(net.to(device), x, y, device=device), clean_acc_images=images, sha256=sha,
            n_params=n_params, device=device, checkpoint_of=spec.name, provenance=made_by,
            surrogate_params={"epoch": k, "epochs": int(recipe["epochs"]),
                              **{p: v for p, v in params.items() if p != "epochs"}}), cache)
        kept.append(k)
    extra = {}
    if size in FULL_TEST_SIZES and variant.is_default and list(out.states) == [""]:
        net.load_state_dict(out.states[""])
        extra["clean_acc_test"] = whole_test_accuracy(net.to(device), spec.dataset, data_dir, device)
    sha = save_states(zoo_paths(spec.name, size, cache)[0], out.states)
    card = make_card(spec, size, recipe=recipe, members=list(out.states), clean_acc=sum(accs.values()) / len(accs),
                     clean_acc_members=accs, clean_acc_images=images, train_s=train_s, sha256=sha,
                     n_params=n_params, device=device, surrogate_params=params, meta=out.meta,
                     epochs_kept=sorted(kept), provenance=made_by, data=variant.describe(), **extra,
                     **({"init_from": recipe["init_from"], "head_reinitialised": head_reset}
                        if recipe.get("init_from") else {}))
    write_card(card, cache)
    return card


def _load_start(net: nn.Module, start: nn.Module, spec: ModelSpec, source: str) -> list[str]:
    """Load the weights of ``source`` (an ``init_from`` entry) into ``net``. Where the two
    predict different label sets, the classifier head's tensors (the only ones whose shapes
    differ) keep their fresh initialisation: a downstream model fine-tuned from a pre-trained one.
    Returns the names of those tensors."""
    own, theirs = net.state_dict(), start.state_dict()
    differ = sorted(k for k in own if k in theirs and own[k].shape != theirs[k].shape)
    missing = sorted(set(own) ^ set(theirs))
    if missing or (differ and spec.num_classes == get_spec(source).num_classes):
        raise UserError(f"model {spec.name!r}: init_from {source!r} does not fit its architecture "
                        f"({(missing or differ)[0]} differs); init_from needs the same architecture")
    net.load_state_dict({k: v for k, v in theirs.items() if k not in differ}, strict=False)
    return differ


def ensure_trained(names: Iterable[str], size: str | None = None, cache: str | os.PathLike | None = None,
                   data_dir: str | os.PathLike | None = None, device: str = "cpu", progress: bool = True,
                   log: Callable[[str], object] = print) -> list[dict]:
    """Train those of ``names`` (with the models they depend on) that are missing or stale, load
    pretrained ones once to write their cards; returns the cards in the order of ``names``."""
    size = size or default_size()
    specs = load_specs()
    cards = []
    for name in dict.fromkeys(names):
        spec = get_spec(name, specs)
        if spec.pretrained is not None and not is_trained(spec, size, cache):
            log(f"loading pretrained {name} ({spec.arch}) ...")
            prepare_pretrained(spec, size, cache, data_dir, device)
        elif spec.defence is not None and not is_trained(spec, size, cache):
            log(f"defending {spec.base} with {spec.defence['kind']} as {name} ...")
            card = prepare_defended(spec, size, cache, data_dir, device, progress)
            log(f"  {name}: clean accuracy {card['clean_acc']:.3f} on test 0-999 "
                f"(base {spec.base}: {card['base_clean_acc']:.3f})")
        elif not is_trained(spec, size, cache):
            stale = shipped_hash(name, size)
            if stale == spec.recipe_hash(size):  # shipped and current, but its weights file is gone
                raise UserError(f"shipped model {name!r} lacks its weights {shipped_paths(name, size)[0]}; "
                                f"restore it from the repository (git checkout -- zoo/)")
            if stale is not None:  # shipped, but the catalogue's recipe has changed since
                log(f"{name}: the shipped weights ({shipped_paths(name, size)[0].parent}) were trained with "
                    f"another recipe (hash {stale}, catalogue {spec.recipe_hash(size)}); training it afresh into the cache")
            log(f"training {name} ({spec.arch_at(size)[0]}, size {size}) ...")
            card = train_spec(spec, size, cache, data_dir, device, progress)
            log(f"  {name}: clean accuracy {card['clean_acc']:.3f} on {card.get('clean_acc_images') or 'test 0-999'}, "
                f"{card['train_s']:.0f} s")
        cards.append(read_card(name, size, cache))
    return cards


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
    if spec.defence is not None:
        from .defences import Defended, resolve

        return Defended(load_model(spec.base, size, cache, device), resolve(spec.defence, spec.source)).eval()
    size = size or default_size()
    spec, _card, states = load_states(name, size, cache)
    member = next(iter(states))
    return instantiate(spec, states[member], name, size).to(device)


def load_members(name: str, size: str | None = None, cache: str | os.PathLike | None = None,
                 device: str = "cpu") -> list[nn.Module]:
    """All weight sets of a zoo entry as eval-mode modules (one for a single model)."""
    spec = get_spec(name)
    if spec.pretrained is not None or spec.defence is not None:
        return [load_model(name, size, cache, device)]
    return load_networks(name, size, cache, device)
