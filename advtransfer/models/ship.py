"""Shipping trained models with the project: ``advtransfer zoo ship NAME --size converged`` copies
a model trained into the cache (its safetensors weights and JSON card) into the checkout's
``zoo/<size>/``, where :func:`advtransfer.models.store.locate` finds it for every user of a fresh
clone. Only a model whose card holds the catalogue's current recipe hash and whose weights match
the card's sha256 is shipped; the card is written without anything that names this machine's
folders.
"""
from __future__ import annotations

import json
import math
import os
import shutil

from ..core.errors import UserError
from ..core.config import env, shipped_zoo_dir
from ..core.resources import source_root
from ..core.utils import atomic_path, atomic_write_text, sha256_file
from .catalogue import get_spec, split_checkpoint
from .collections import is_collection
from .sources import declared, load_model
from .store import verify_checksum, zoo_paths


def ship(name: str, size: str, cache: str | os.PathLike | None = None) -> dict:
    """Copy ``name`` at ``size`` from the cache into ``zoo/<size>/`` of the checkout (or of
    $ADVTRANSFER_SHIPPED_ZOO); returns its card."""
    root = shipped_zoo_dir()
    if root is None or (source_root() is None and env("ADVTRANSFER_SHIPPED_ZOO") is None):
        raise UserError("zoo ship writes into a source checkout's zoo/ folder (or $ADVTRANSFER_SHIPPED_ZOO); "
                        "run it from a clone of the project")
    spec = get_spec(name)
    if not declared(spec).has_weights:
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
    if (not is_collection(card) and "original_est" not in (card.get("clean_acc_test") or {})
            and spec.label_set() == "cifar10"):  # the literature's number (a collection's is its members')
        from .loading import whole_test_accuracy

        card["clean_acc_test"] = whole_test_accuracy(load_model(name, size, cache, member=0), spec.dataset)
    if spec.family == "defended" and "robust_acc_pgd20" not in card and spec.label_set() == "cifar10":
        card["robust_acc_pgd20"] = robust_accuracy(load_model(name, size, cache, member=0))
    dest = root / size
    dest.mkdir(parents=True, exist_ok=True)
    with atomic_path(dest / f"{name}.safetensors") as tmp:
        shutil.copyfile(weights, tmp)
    if sha256_file(dest / f"{name}.safetensors") != card["sha256"]:
        raise UserError(f"copying {weights} to {dest} changed its bytes; try again")
    atomic_write_text(dest / f"{name}.json", json.dumps(card, indent=2, default=float) + "\n")
    return card


def robust_accuracy(model, n: int = 1000, eps: float = 8 / 255, steps: int = 20, alpha: float = 2 / 255) -> float:
    """Accuracy (fraction) of ``model`` on CIFAR-10 test images 0..n-1 under the harness's white-box
    ``pgd`` (L∞ ``eps``, ``steps`` steps of ``alpha``, one random start): the adversarially trained
    victim's line is 38% at PGD-20, 8/255."""
    import torch

    from ..attacks import SurrogateSet, create_attack
    from ..data import eval_subset, load_cifar10

    x, y, idx = eval_subset(load_cifar10("test"), n)
    model.eval()
    xa = create_attack("pgd", eps=eps, steps=steps, alpha=alpha)(SurrogateSet(model), x, y, idx)
    with torch.no_grad():
        return float((model(xa).argmax(1) == y).double().mean())


#: the adversarially trained victim's robust-accuracy line (PGD-20, 8/255)
ROBUST_LINE = 0.38

#: clean-accuracy lines of the converged zoo per family, without test-time augmentation (the
#: literature's CIFAR-10 models sit at 92-95%: pytorch-cifar-models' ResNet-20 92.6%, VGG-16-BN 94.2%)
ACCURACY_LINES = {"cnn": 0.91, "mobile": 0.90, "dense": 0.90, "vit": 0.80, "defended": 0.72}
#: plain-convolution (VGG-style, here airbench) nets
PLAIN_CONV_LINE = 0.92


def accuracy_line(card: dict) -> float | None:
    """The clean-accuracy line a shipped model's card is held to (None for a family without one)."""
    if card.get("arch") in ("airbench", "vgg"):
        return PLAIN_CONV_LINE
    return ACCURACY_LINES.get(card.get("family", ""))


def early_stopped(card: dict) -> tuple[int, int] | None:
    """(epoch, epochs) when the card is an early-stopped checkpoint ``<entry>@epoch<k>`` (kind
    ``es``: the weights after epoch k of a run of ``epochs``, trained by its entry), else None."""
    if card.get("kind") != "es":
        return None
    p = card.get("surrogate_params") or {}
    return int(p["epoch"]), int(p["epochs"])


def line_accuracy(card: dict) -> float:
    """The accuracy held against the line: the estimate for the original test set where the card
    has one (``clean_acc_test.original_est``, see :func:`~advtransfer.models.loading.whole_test_accuracy`),
    else the whole test set's, else the card's test 0-999 figure."""
    t = card.get("clean_acc_test") or {}
    for key in ("original_est", "all"):
        if t.get(key) is not None:
            return float(t[key])
    return float(card["clean_acc"])


def training_time(card: dict) -> str:
    """The card's training time in minutes, for the shipped table. A run resumed over sittings
    counts every sitting's finished epochs (``train_s``); one whose earlier sittings did not record
    their time (states saved before that count existed) says which epochs its minutes cover."""
    meta = card.get("meta") or {}
    resumed = meta.get("resumed_at_epochs") or []
    minutes = f"{card['train_s'] / 60:.0f} min"
    if not resumed:
        return minutes
    if meta.get("train_s_earlier") is None:
        epochs = math.ceil(float(card["recipe"]["epochs"]))
        return f"{minutes} for epochs {resumed[-1] + 1}-{epochs} (resumed; earlier sittings not timed)"
    return f"{minutes} over {len(resumed) + 1} sittings"


def shipped_table(size: str) -> str:
    """A Markdown table of the models shipped at ``size``, from their cards: clean accuracy on the
    bit-exact test images 0-999, on the whole test set and estimated for the original release,
    the family's line, training time on the machine that made them, parameter count and the
    weights' sha256 (its first 12 hex digits). A collection (LGV's snapshots) gets its members'
    mean on test images 0-999 and its members' range instead of a line; a SWAG posterior its mean
    network's accuracy."""
    root = shipped_zoo_dir()
    cards = sorted((root / size).glob("*.json")) if root is not None else []
    if not cards:
        return f"(no models shipped at size {size})"
    head = ("| model | network | family | parameters | bit-exact test 0-999 | all 10,000 test images (9,000 JPEG-rebuilt) | "
            "estimated on the original test set | line | training (2 cores) | sha256 |\n"
            "|---|---|---|---:|---:|---:|---:|---|---:|---|")
    pct = lambda v: "n/a" if v is None else f"{100 * v:.2f}%"  # noqa: E731
    rows = []
    for path in cards:
        c = json.loads(path.read_text())
        t = c.get("clean_acc_test") or {}
        arch = c["arch"] + ("" if not c.get("arch_kwargs") else " " + json.dumps(c["arch_kwargs"], sort_keys=True)
                            .replace('"', "").replace(" ", ""))
        line = accuracy_line(c)
        es = early_stopped(c)
        if es is not None:  # a kept checkpoint of a finished run: deliberately short of convergence
            verdict = f"none: the weights after epoch {es[0]} of {es[1]}"
        elif c.get("kind") == "swag":  # a Gaussian over weights: its stored network is the mean
            sp = c.get("surrogate_params") or {}
            mode = {"diag": "diagonal", "lowrank": "low-rank"}.get(sp.get("mode", "diag"), sp.get("mode"))
            verdict = (f"none: a {mode} SWAG posterior from `{sp.get('init_from', '?')}`, the moments of "
                       f"{sp.get('n_collected', '?')} visited weight sets (column 5: its mean network)")
        elif is_collection(c):  # LGV's snapshots, cSGLD's samples: a set of weights, one drawn per attack step
            accs = [100 * a for a in (c.get("clean_acc_members") or {}).values()]
            start = (c.get("surrogate_params") or {}).get("init_from")
            verdict = (f"none: {len(accs) or '?'} {c.get('kind', 'collection')} weight sets "
                       + (f"from `{start}`" if start else "trained from scratch")
                       + (f", each {min(accs):.1f}-{max(accs):.1f}% (mean in column 5)" if accs else ""))
        elif line is None:
            verdict = "none"
        else:
            gap = 100 * (line_accuracy(c) - line)
            verdict = f"{100 * line:.0f}%: " + ("held" if gap >= 0 else f"{-gap:.1f} short")
        if c.get("robust_acc_pgd20") is not None:
            rob = c["robust_acc_pgd20"]
            verdict += (f"; PGD-20 {100 * rob:.1f}% (line {100 * ROBUST_LINE:.0f}%: "
                        + ("held)" if rob >= ROBUST_LINE else f"{100 * (ROBUST_LINE - rob):.1f} short)"))
        rows.append(f"| `{c['name']}` | {arch} | {c['family']} | {c['n_params']:,} | {100 * c['clean_acc']:.1f}% | "
                    f"{pct(t.get('all'))} | {pct(t.get('original_est'))} | {verdict} | "
                    + (f"in `{split_checkpoint(c['name'])[0]}`" if es is not None else training_time(c))
                    + f" | `{c['sha256'][:12]}` |")
    return "\n".join([head, *rows])
