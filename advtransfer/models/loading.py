"""Weights and evaluation helpers shared by every kind of zoo entry: verified weights loaded into
networks (:func:`load_states`, :func:`instantiate`, :func:`load_networks`) and the test images a
card's clean accuracy is measured on (:func:`eval_split`, :func:`whole_test_accuracy`). Which kind
an entry is, and how it is trained, loaded or carded, is :mod:`.sources`.

Nothing here changes torch's global random state: networks are initialised under
:func:`advtransfer.core.rng.seeded`.
"""
from __future__ import annotations

import os

import torch
import torch.nn as nn

from ..core.config import default_size
from ..core.errors import UserError
from .archs import ImageClassifier
from .cards import read_card
from .catalogue import ModelSpec, get_spec
from .store import States, locate, read_states

_EVAL_IMAGES = 1000  # clean accuracy on test images 0..999


def eval_split(dataset: str, data_dir, variant=None):
    """Test images 0..999 ``(x [0,1] N×3×H×W, y)`` of ``dataset``; with a training-data
    ``variant`` (:mod:`advtransfer.data.variants`), in the model's own domain (its shift) and label
    set, images outside its task left out."""
    from ..data import eval_subset, load_dataset

    test = load_dataset(dataset, "test", data_dir)
    x, y, idx = eval_subset(test, min(_EVAL_IMAGES, len(test)))
    if variant is None or (variant.shift == "none" and variant.labels == "cifar10"):
        return x, y
    from ..data.variants import shift_images

    if variant.shift != "none":
        raw = shift_images(test.x[idx.numpy()], idx.numpy(), variant.shift)
        x = torch.from_numpy(raw).permute(0, 3, 1, 2).float().div_(255.0).contiguous()
    yv = variant.label_map()[y]
    keep = yv >= 0
    return x[keep], yv[keep]


#: sizes whose cards also give clean accuracy on the whole test set (the literature's number;
#: test images 1,000-9,999 of the offline copy are JPEG-rebuilt, see the data README)
FULL_TEST_SIZES = ("converged", "full")


def whole_test_accuracy(model: nn.Module, dataset: str = "cifar10", data_dir=None, device: str = "cpu") -> dict:
    """Clean accuracy (fraction) of ``model`` on every test image, and on the bit-exact ones
    (the offline copy's ``lossless`` flags) and the rest separately: ``{'all', 'lossless', 'rebuilt', 'n'}``.

    Where the copy has rebuilt images, also ``lossless_jpeg``: accuracy on the bit-exact images
    re-encoded as JPEG at the rebuilt ones' quality (75), the cost of the rebuilding measured on
    the same images, and ``original_est``: the whole test set's accuracy as the original release
    would give it, ``all + (share rebuilt) · (lossless − lossless_jpeg)``, the number to hold
    against the literature's."""
    from ..data import load_dataset
    from ..core.metrics import labels

    test = load_dataset(dataset, "test", data_dir)
    x, y, _ = test.tensors()
    right = labels(model, x, 500, device) == y
    out = {"all": float(right.double().mean()), "n": len(y)}
    if test.lossless is not None:
        keep = torch.from_numpy(test.lossless.astype(bool))
        out.update(lossless=float(right[keep].double().mean()) if keep.any() else None,
                   rebuilt=float(right[~keep].double().mean()) if (~keep).any() else None,
                   n_lossless=int(keep.sum()))
        if keep.any() and (~keep).any():
            from .defences import jpeg  # how the offline copy's rebuilt images were made

            xj = jpeg(x[keep], quality=75)
            out["lossless_jpeg"] = float((labels(model, xj, 500, device) == y[keep]).double().mean())
            share = float((~keep).double().mean())
            out["original_est"] = out["all"] + share * (out["lossless"] - out["lossless_jpeg"])
    return out


def eval_images_label(x: torch.Tensor, variant) -> str:
    """How the card describes the images its clean accuracy was measured on."""
    if variant is None or (variant.shift == "none" and variant.labels == "cifar10"):
        return f"test 0-{len(x) - 1}"
    return f"test 0-{_EVAL_IMAGES - 1} ({variant.describe()}; {len(x)} in task)"


def load_states(name: str, size: str | None = None, cache: str | os.PathLike | None = None
                ) -> tuple[ModelSpec, dict, States]:
    """Spec, card and verified weights (member → state dict) of a trained model."""
    size = size or default_size()
    spec = get_spec(name)
    spec.declared().require_weights()  # a pretrained or defended entry: one line
    weights, _ = locate(name, size, cache)
    card = read_card(name, size, cache)
    if card is None or not weights.is_file():
        raise UserError(f"model {name!r} is not trained at size {size!r}; run `advtransfer zoo train {name}`")
    if card.get("recipe_hash") != spec.recipe_hash(size):
        raise UserError(f"model {name!r} in the cache was trained with another recipe; "
                        f"run `advtransfer zoo train {name}` to retrain it")
    return spec, card, read_states(weights, card.get("sha256"), card.get("members", [""]), name)


def instantiate(spec: ModelSpec, state: dict[str, torch.Tensor], where: str = "",
                size: str | None = None) -> ImageClassifier:
    """Build ``spec``'s network at ``size`` and load ``state`` into it (eval mode, gradients off for weights)."""
    net = spec.build(size)
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise UserError(f"checkpoint {where or spec.name} does not fit architecture {spec.arch_at(size)[0]!r} "
                        f"({first}); it is foreign or stale: delete it and retrain") from None
    net.eval()
    for p in net.parameters():
        p.requires_grad_(False)
    if spec.label_set() != "cifar10":  # a downstream model: scored on its own labels
        from ..data.variants import DataVariant

        net.label_map = DataVariant(labels=spec.label_set()).label_map()
    return net


def load_networks(name: str, size: str | None = None, cache: str | os.PathLike | None = None,
                  device: str = "cpu") -> list[ImageClassifier]:
    """Every weight set of the trained entry ``name`` (one for a single network, K for a
    collection's members), each as an eval-mode network on ``device``."""
    size = size or default_size()
    spec, _card, states = load_states(name, size, cache)
    return [instantiate(spec, sd, f"{name}[{m}]", size).to(device) for m, sd in states.items()]
