"""The on-disk model store: where a zoo model's files live in the cache, and how its weights are
written (safetensors, atomically) and read back (only after checking the card's sha256).

Cache layout: ``$ADVTRANSFER_CACHE/zoo/<size>/<name>.safetensors`` and ``<name>.json`` (the card,
see :mod:`.cards`). The project ships some models in the same layout under ``zoo/`` (read-only:
:func:`locate` prefers a shipped model while its recipe is current; training writes to the cache). A single model is stored flat; a collection (several weight sets) stores each
tensor as ``<member>/<key>``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import torch

from ..core.config import cache_dir
from ..core.errors import UserError
from ..core.utils import atomic_path, sha256_file

States = dict[str, dict[str, torch.Tensor]]


def zoo_paths(name: str, size: str, cache: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """(weights file, card file) of model ``name`` at ``size`` in the cache (``None``: the default cache)."""
    root = cache_dir(cache) / "zoo" / size
    return root / f"{name}.safetensors", root / f"{name}.json"


def shipped_paths(name: str, size: str) -> tuple[Path, Path] | None:
    """(weights file, card file) of ``name`` at ``size`` among the weights shipped with the
    project (:func:`advtransfer.core.config.shipped_zoo_dir`), or None when none are shipped."""
    from ..core.config import shipped_zoo_dir

    root = shipped_zoo_dir()
    if root is None or not (root / size / f"{name}.json").is_file():
        return None
    return root / size / f"{name}.safetensors", root / size / f"{name}.json"


def shipped_hash(name: str, size: str) -> str | None:
    """The recipe hash on the shipped card of ``name`` at ``size`` (None: not shipped)."""
    import json

    paths = shipped_paths(name, size)
    if paths is None:
        return None
    try:
        return json.loads(paths[1].read_text()).get("recipe_hash")
    except (OSError, json.JSONDecodeError):
        raise UserError(f"shipped model card {paths[1]} is corrupt; restore it from the repository "
                        f"(git checkout -- {paths[1].parent.name}/{paths[1].name})") from None


def locate(name: str, size: str, cache: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """(weights file, card file) that hold model ``name`` at ``size``: the shipped copy while its
    card's recipe hash is the catalogue's (a shipped model is the canonical one: results cite its
    checksum; a shipped card may name its weights on the Hub, ``weights_hub``, fetched when the
    file beside it is absent), else the cache (where training writes)."""
    shipped = shipped_paths(name, size)
    if shipped is not None:
        from .catalogue import get_spec

        try:
            spec = get_spec(name)
        except UserError:
            spec = None
        # an early-stopped checkpoint <entry>@epoch<k> is shipped beside its run: without it a
        # clone that has the shipped entry would find the entry trained but not its checkpoint
        if spec is not None and spec.declared().has_weights and shipped_hash(name, size) == spec.recipe_hash(size):
            return _hub_weights(*shipped)
    return zoo_paths(name, size, cache)


def _hub_weights(weights: Path, card_file: Path) -> tuple[Path, Path]:
    """A shipped card whose weights file is absent but which names ``weights_hub``: the file
    fetched from the Hugging Face Hub (checked against the card's sha256; see :mod:`.hub`)."""
    import json

    if weights.is_file():
        return weights, card_file
    card = json.loads(card_file.read_text())
    ref = card.get("weights_hub")
    if not ref:
        return weights, card_file
    from .hub import hub_file

    return hub_file(ref, card.get("sha256"), f"shipped model {card.get('name', weights.stem)!r}: weights"), card_file


def weights_path(name: str, size: str, cache: str | os.PathLike | None = None) -> Path:
    return zoo_paths(name, size, cache)[0]


def card_path(name: str, size: str, cache: str | os.PathLike | None = None) -> Path:
    return zoo_paths(name, size, cache)[1]


def states_to_flat(states: States) -> dict[str, torch.Tensor]:
    """One flat tensor dict for safetensors: a single model (member ``""``) as is, else ``member/key``."""
    if list(states) == [""]:
        return {k: v.contiguous() for k, v in states[""].items()}
    return {f"{m}/{k}": v.contiguous() for m, sd in states.items() for k, v in sd.items()}


def flat_to_states(flat: dict[str, torch.Tensor], members: Sequence[str]) -> States:
    """Inverse of :func:`states_to_flat` for the card's ``members``."""
    if list(members) == [""]:
        return {"": flat}
    out: States = {m: {} for m in members}
    for k, v in flat.items():
        m, _, key = k.partition("/")
        if m not in out:
            raise UserError(f"checkpoint holds an unexpected member {m!r}")
        out[m][key] = v
    return out


def save_states(path: Path, states: States) -> str:
    """Write ``states`` to ``path`` as safetensors, atomically; returns the file's sha256."""
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file(states_to_flat(states), str(tmp))
    return sha256_file(path)


def verify_checksum(path: Path, expected: str | None, name: str) -> None:
    """UserError unless the file at ``path`` has sha256 ``expected`` (the card's)."""
    if sha256_file(path) != expected:
        shipped = shipped_paths(name, path.parent.name)
        if shipped is not None and shipped[0] == path:
            raise UserError(f"shipped weights {path} do not match their card's sha256 (corrupt or replaced); "
                            f"restore them from the repository (git checkout -- zoo/)")
        raise UserError(f"checkpoint {path} does not match its card's sha256 (corrupt or replaced); "
                        f"delete it and run `advtransfer zoo train {name}`")


def read_states(path: Path, expected_sha256: str | None, members: Sequence[str], name: str) -> States:
    """The weights at ``path`` after the checksum check, split into ``members``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    verify_checksum(path, expected_sha256, name)
    try:
        flat = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise UserError(f"checkpoint {path} cannot be read ({exc}); delete it and retrain") from None
    return flat_to_states(flat, members)
