"""Shipping trained models with the project: ``advtransfer zoo ship NAME --size converged`` copies
a model trained into the cache (its safetensors weights and JSON card) into the checkout's
``zoo/<size>/``, where :func:`advtransfer.models.store.locate` finds it for every user of a fresh
clone. Only a model whose card holds the catalogue's current recipe hash and whose weights match
the card's sha256 is shipped; the card is written without anything that names this machine's
folders.
"""
from __future__ import annotations

import json
import os
import shutil

from ..errors import UserError
from ..config import env, shipped_zoo_dir
from ..resources import source_root
from ..utils import atomic_path, atomic_write_text, sha256_file
from .catalogue import get_spec
from .store import verify_checksum, zoo_paths


def ship(name: str, size: str, cache: str | os.PathLike | None = None) -> dict:
    """Copy ``name`` at ``size`` from the cache into ``zoo/<size>/`` of the checkout (or of
    $ADVTRANSFER_SHIPPED_ZOO); returns its card."""
    root = shipped_zoo_dir()
    if root is None or (source_root() is None and env("ADVTRANSFER_SHIPPED_ZOO") is None):
        raise UserError("zoo ship writes into a source checkout's zoo/ folder (or $ADVTRANSFER_SHIPPED_ZOO); "
                        "run it from a clone of the project")
    spec = get_spec(name)
    if spec.pretrained is not None or spec.defence is not None:
        raise UserError(f"model {name!r} is not trained by the harness: nothing to ship")
    weights, card_file = zoo_paths(name, size, cache)
    if not card_file.is_file() or not weights.is_file():
        raise UserError(f"model {name!r} is not trained at size {size!r} in the cache; "
                        f"run `advtransfer zoo train {name} --size {size}` first")
    card = json.loads(card_file.read_text())
    if card.get("recipe_hash") != spec.recipe_hash(size):
        raise UserError(f"model {name!r} in the cache was trained with another recipe than the catalogue's; "
                        f"retrain it (advtransfer zoo train {name} --size {size}) before shipping")
    verify_checksum(weights, card.get("sha256"), name)
    if "clean_acc_test" not in card and spec.label_set() == "cifar10":  # the literature's number
        from .loading import load_model, whole_test_accuracy

        card["clean_acc_test"] = whole_test_accuracy(load_model(name, size, cache), spec.dataset)
    dest = root / size
    dest.mkdir(parents=True, exist_ok=True)
    with atomic_path(dest / f"{name}.safetensors") as tmp:
        shutil.copyfile(weights, tmp)
    if sha256_file(dest / f"{name}.safetensors") != card["sha256"]:
        raise UserError(f"copying {weights} to {dest} changed its bytes; try again")
    atomic_write_text(dest / f"{name}.json", json.dumps(card, indent=2, default=float) + "\n")
    return card


def shipped_table(size: str) -> str:
    """A Markdown table of the models shipped at ``size``, from their cards: clean accuracy on the
    whole test set and on the bit-exact test images 0-999, training time on the machine that made
    them, parameter count and the weights' sha256 (its first 12 hex digits)."""
    root = shipped_zoo_dir()
    cards = sorted((root / size).glob("*.json")) if root is not None else []
    if not cards:
        return f"(no models shipped at size {size})"
    head = ("| model | network | family | parameters | clean acc., all 10,000 test images (9,000 JPEG-rebuilt) | bit-exact test 0-999 | "
            "training (2 cores) | sha256 |\n|---|---|---|---:|---:|---:|---:|---|")
    rows = []
    for path in cards:
        c = json.loads(path.read_text())
        whole = (c.get("clean_acc_test") or {}).get("all")
        arch = c["arch"] + ("" if not c.get("arch_kwargs") else " " + json.dumps(c["arch_kwargs"], sort_keys=True)
                            .replace('"', "").replace(" ", ""))
        rows.append(f"| `{c['name']}` | {arch} | {c['family']} | {c['n_params']:,} | "
                    f"{'n/a' if whole is None else f'{100 * whole:.2f}%'} | {100 * c['clean_acc']:.1f}% | "
                    f"{c['train_s'] / 60:.0f} min | `{c['sha256'][:12]}` |")
    return "\n".join([head, *rows])
