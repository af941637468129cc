"""A zoo card rendered as a Hugging Face model card, and a folder laid out for a Hub repository.

:func:`hf_model_card` turns a card (the JSON beside each trained model: recipe, checksums, measured
accuracy and cost) into the Hub's ``README.md`` convention: YAML front matter (license, library,
tags, datasets, metrics and a ``model-index`` with the measured accuracies) followed by the
network, the recipe, the measured numbers and how to load the weights with advtransfer.
:func:`export_hf` writes, per model, ``<out>/<name>/README.md``, ``model.safetensors`` (the
weights, byte for byte) and ``advtransfer.json`` (the card), which ``huggingface-cli upload``
publishes as is; a shipped card then names the file with ``weights_hub`` (:mod:`.hub`).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Iterable

import yaml

from ..core.errors import UserError

#: the Hub's id of CIFAR-10 (the datasets the zoo is trained and measured on)
HUB_DATASETS = {"cifar10": "uoft-cs/cifar10", "imagenet": "ILSVRC/imagenet-1k"}
DATASET_NAMES = {"cifar10": "CIFAR-10", "imagenet": "ImageNet-1k"}


def _metrics(card: dict) -> list[dict]:
    images = card.get("clean_acc_images") or "test 0-999"
    out = []
    if card.get("clean_acc") is not None:
        out.append({"type": "accuracy", "value": round(float(card["clean_acc"]), 4),
                    "name": f"clean accuracy ({images})"})
    if card.get("robust_acc_pgd20") is not None:
        out.append({"type": "accuracy", "value": round(float(card["robust_acc_pgd20"]), 4),
                    "name": f"robust accuracy, white-box PGD-20 L-inf 8/255 ({images})"})
    return out


def hf_model_card(card: dict, license: str = "mit") -> str:
    """The Hub ``README.md`` of a zoo card (a dict as written by :mod:`.cards`)."""
    name = str(card.get("name", "model"))
    dataset = str(card.get("dataset", "cifar10"))
    hub_ds = HUB_DATASETS.get(dataset, dataset)
    metrics = _metrics(card)
    front: dict = {"license": license, "library_name": "advtransfer",
                   "tags": ["image-classification", "adversarial-robustness", "transferability", dataset,
                            f"family-{card.get('family', 'cnn')}"],
                   "datasets": [hub_ds], "metrics": ["accuracy"] if metrics else []}
    if metrics:
        front["model-index"] = [{"name": name, "results": [{
            "task": {"type": "image-classification", "name": "Image Classification"},
            "dataset": {"name": DATASET_NAMES.get(dataset, dataset), "type": hub_ds, "split": "test"},
            "metrics": metrics}]}]
    lines = ["---", yaml.safe_dump(front, sort_keys=False).rstrip(), "---", "", f"# {name}", ""]
    arch = card.get("arch", "?")
    kw = card.get("arch_kwargs") or {}
    arch_s = arch + (f" ({', '.join(f'{k}={v}' for k, v in kw.items())})" if kw else "")
    kind = str(card.get("kind", "single"))
    lines += [f"A {DATASET_NAMES.get(dataset, dataset)} classifier ({'one network' if kind == 'single' else kind}) "
              "of the advtransfer zoo "
              f"(size `{card.get('size', '?')}`, family `{card.get('family', '?')}`), for adversarial-transferability "
              "experiments: a surrogate to craft on or a victim to evaluate.", "",
              "| | |", "|---|---|", f"| network | {arch_s} |"]
    if card.get("n_params") is not None:
        lines.append(f"| parameters | {int(card['n_params']):,} |")
    for m in metrics:
        lines.append(f"| {m['name']} | {100 * m['value']:.1f}% |")
    if card.get("train_s") is not None:
        prov = card.get("provenance") or {}
        where = f" on {prov.get('threads', '?')} CPU threads" if card.get("device", "cpu") == "cpu" else f" on {card.get('device')}"
        lines.append(f"| training time | {float(card['train_s']) / 60:.1f} min{where} |")
    members = card.get("members") or [""]
    if len(members) > 1:
        lines.append(f"| weight sets | {len(members)} ({', '.join(members[:5])}{' ...' if len(members) > 5 else ''}) |")
    lines += [f"| sha256 of model.safetensors | `{card.get('sha256', '?')}` |",
              f"| recipe hash | `{card.get('recipe_hash', '?')}` |", ""]
    if card.get("recipe"):
        lines += ["## Recipe", "", "```yaml", yaml.safe_dump(card["recipe"], sort_keys=True).rstrip(), "```", ""]
    versions = card.get("versions") or {}
    if versions:
        lines += ["## Software", "", ", ".join(f"{k} {v}" for k, v in versions.items()), ""]
    lines += ["## Use", "", "Pixels in [0, 1], shape N×3×32×32 (the network normalises inside); logits out.", "",
              "```python", "import advtransfer",
              f"model = advtransfer.load_model({name!r}, size={card.get('size', 'converged')!r})",
              "```", "",
              "The weights file is checked against the sha256 above before it is loaded. "
              "`advtransfer.json` beside it is the harness's own card (every field the numbers above come from).", ""]
    return "\n".join(lines)


def export_hf(names: Iterable[str], size: str, out: str | os.PathLike, cache: str | os.PathLike | None = None
              ) -> list[Path]:
    """Write ``<out>/<name>/{README.md, model.safetensors, advtransfer.json}`` for each trained
    model ``name`` at ``size`` (the shipped copy or the cache's); returns the folders. UserError
    for a model that is not trained or whose weights do not match its card."""
    from .cards import read_card
    from .store import locate, verify_checksum

    out = Path(out)
    folders = []
    for name in names:
        card = read_card(name, size, cache)
        weights, _ = locate(name, size, cache)
        if card is None or not weights.is_file():
            raise UserError(f"model {name!r} is not trained at size {size!r}; run `advtransfer zoo train {name} "
                            f"--size {size}` first")
        verify_checksum(weights, card.get("sha256"), name)
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(weights, folder / "model.safetensors")
        (folder / "advtransfer.json").write_text(json.dumps(card, indent=2) + "\n")
        (folder / "README.md").write_text(hf_model_card(card))
        folders.append(folder)
    return folders
