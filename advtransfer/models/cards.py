"""Model cards: the JSON file beside each model's weights in the cache.

A card holds the architecture, the resolved recipe and its hash (``recipe_hash``; the model is
stale when the catalogue's hash differs), the training method's ``method_version``, the
members of a collection, clean accuracy on test images 0–999 (a fraction in [0,1]), training
time in seconds, the sha256 of the weights (checked at every load) and the library versions.
:func:`make_card` is the one builder for every kind of entry: trained, pretrained, and the
epoch checkpoints ``<entry>@epoch<k>``.
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Any, Sequence

from ..core.config import default_size
from ..core.errors import UserError
from ..core.utils import atomic_write_text
from .catalogue import ModelSpec
from .store import card_path

CARD_VERSION = 1


def make_card(spec: ModelSpec, size: str, *, recipe: dict | None, members: Sequence[str],
              clean_acc: float | None, clean_acc_images: str | None, sha256: str, device: str,
              name: str | None = None, kind: str | None = None, n_params: int | None = None,
              clean_acc_members: dict[str, float] | None = None, train_s: float = 0.0,
              surrogate_params: dict | None = None, **extra: Any) -> dict:
    """The card of ``spec`` at ``size``. ``name``/``kind`` override the spec's (epoch checkpoints,
    pretrained entries); ``clean_acc`` is a fraction on ``clean_acc_images`` (e.g. "test 0-999");
    ``train_s`` in seconds; ``extra`` adds kind-specific keys (``pretrained``, ``meta``,
    ``epochs_kept``, ``checkpoint_of``, ``load_s``)."""
    from ..core.utils import versions

    card = {
        "card_version": CARD_VERSION, "name": name or spec.name, "arch": spec.arch_at(size)[0], "arch_kwargs": spec.arch_at(size)[1],
        "family": spec.family, "kind": kind or spec.kind, "dataset": spec.dataset, "size": size,
        "recipe": recipe, "recipe_hash": spec.recipe_hash(size), "method_version": spec.method_version(),
        "members": list(members), "clean_acc": clean_acc,
        "clean_acc_members": clean_acc_members if clean_acc_members and list(clean_acc_members) != [""] else None,
        "clean_acc_images": clean_acc_images, "train_s": round(float(train_s), 2), "sha256": sha256,
        "n_params": n_params, "surrogate_params": dict(surrogate_params or {}),
    }
    card.update(extra)
    card.update(versions=versions(), created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                device=device)
    return card


def write_card(card: dict, cache: str | os.PathLike | None = None) -> None:
    """Write ``card`` atomically to its place in the cache (by its ``name`` and ``size``)."""
    atomic_write_text(card_path(card["name"], card["size"], cache), json.dumps(card, indent=2, default=float))


def read_card(name: str, size: str | None = None, cache: str | os.PathLike | None = None) -> dict | None:
    """The JSON card of a trained model, or None if it is not trained (at this size)."""
    from .store import locate

    path = locate(name, size or default_size(), cache)[1]
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        raise UserError(f"model card {path} is corrupt; delete it and run `advtransfer zoo train`") from None
