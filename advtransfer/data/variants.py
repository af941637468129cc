"""Training-data variants and label sets: what a model was trained on, when it is not "all of
CIFAR-10's training images with CIFAR-10's labels".

A zoo entry declares its variant inside its recipe (so it enters the recipe hash)::

    recipe:
      data: {source: half_b, balance: 20/80, shift: colour, labels: vehicles_animals}

``source``
    ``all`` (default), or one of two disjoint halves of the training split, ``half_a`` and
    ``half_b``: within every class, the first and the second half of that class's images in
    dataset order (so each half keeps the split's class balance). Two halves are the harness's
    stand-in for DUMB's two dataset sources (Bing and Google images of the same classes): the
    same distribution, disjoint images.
``balance``
    One of DUMB's balance levels (Alecci et al. 2023): ``50/50``, ``40/60``, ``30/70``,
    ``20/80``. DUMB's tasks are binary and the level is the share of the two classes; on the
    harness's multi-class label sets the first half of the classes (CIFAR-10: 0-4) shares the
    first number and the second half (5-9) the second, split evenly within each half, by
    subsampling the source to ``train_subset`` images in all. ``50/50`` is the balanced
    subsample (the same number of images of every class). Evaluation stays on the balanced test
    images, as in DUMB.
``shift``
    A distribution-shifted copy of the images (a second domain): see :data:`SHIFTS`.
    Deterministic; where random, drawn per image from the image's dataset index.
``labels``
    The label set the model predicts (:data:`LABEL_SETS`): ``cifar10`` (default), a coarse
    grouping (``vehicles_animals``) or half of the classes (``first5``, ``last5``: images of the
    other classes are not in the task). A model whose label set is not the dataset's is a
    *downstream* victim: it is evaluated on its own labels, and an image counts as a success when
    the victim's own prediction changes from correct (images outside its task are not counted).

A grid evaluates on a shifted domain by naming the dataset ``cifar10-<shift>`` (e.g.
``cifar10-colour``): the test images are the shifted copies.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import torch

from ..core.errors import UserError

#: version of the selection and shift code: enters the recipe hash of every entry with ``data``
#: (bump it whenever a variant's images change, so models trained on the old ones retrain)
VERSION = 1

#: DUMB's balance levels: share (%) of the first half of the classes / of the second half
BALANCE_LEVELS = ("50/50", "40/60", "30/70", "20/80")
SOURCES = ("all", "half_a", "half_b")

#: label sets: CIFAR-10 class → the set's class (-1: not in the task), and the set's class names
LABEL_SETS: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = {
    "cifar10": (tuple(range(10)), ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                                   "ship", "truck")),
    # vehicles (airplane, automobile, ship, truck) vs animals
    "vehicles_animals": ((0, 0, 1, 1, 1, 1, 1, 1, 0, 0), ("vehicle", "animal")),
    "first5": ((0, 1, 2, 3, 4, -1, -1, -1, -1, -1), ("airplane", "automobile", "bird", "cat", "deer")),
    "last5": ((-1, -1, -1, -1, -1, 0, 1, 2, 3, 4), ("dog", "frog", "horse", "ship", "truck")),
}

#: the label a downstream victim's out-of-task images get: matches no prediction, so such an
#: image is never clean-correct and never counted (distinct from ``metrics.ABSTAIN``)
OUT_OF_TASK = -2


def _colour(x: np.ndarray, index: np.ndarray) -> np.ndarray:
    """A fixed colour cast of the whole domain: channels mixed (R←G, G←B, B←R, 70%, plus 30% of
    the original), contrast lowered to 70% around mid-grey and a warm offset; float HWC in [0,1]."""
    mix = np.array([[0.3, 0.7, 0.0], [0.0, 0.3, 0.7], [0.7, 0.0, 0.3]], dtype=np.float32)
    y = x @ mix.T
    y = 0.5 + 0.7 * (y - 0.5) + np.array([0.06, 0.02, -0.06], dtype=np.float32)
    return y


def _noise(x: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Gaussian noise, σ = 0.08 (CIFAR-10-C's Gaussian noise at severity 3), drawn per image from
    its dataset index."""
    out = np.empty_like(x)
    for j, i in enumerate(index.tolist()):
        rng = np.random.default_rng([20261201, int(i)])
        out[j] = x[j] + rng.normal(0.0, 0.08, size=x.shape[1:]).astype(np.float32)
    return out


def _blur(x: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Gaussian blur, σ = 1 pixel (a defocus-like corruption), reflect padding."""
    from scipy.ndimage import gaussian_filter

    return gaussian_filter(x, sigma=(0, 1.0, 1.0, 0), mode="reflect")


#: distribution shifts on float N×H×W×C images in [0,1] (result clipped and rounded to uint8)
SHIFTS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "colour": _colour, "noise": _noise, "blur": _blur}


def shift_images(x: np.ndarray, index: np.ndarray, shift: str, chunk: int = 5000) -> np.ndarray:
    """``x`` (uint8 N×H×W×C) shifted by ``shift`` (:data:`SHIFTS`), as uint8; ``index``: the images'
    dataset indices (the seed of random shifts)."""
    if shift == "none":
        return x
    if shift not in SHIFTS:
        from ..core.registry import suggest

        raise UserError(suggest(shift, ["none", *SHIFTS], "shift"))
    out = np.empty_like(x)
    for s in range(0, len(x), chunk):
        xf = x[s:s + chunk].astype(np.float32) / 255.0
        y = SHIFTS[shift](xf, np.asarray(index[s:s + chunk]))
        out[s:s + chunk] = np.clip(np.rint(np.clip(y, 0, 1) * 255.0), 0, 255).astype(np.uint8)
    return out


@dataclass(frozen=True)
class DataVariant:
    """A recipe's ``data`` mapping (see the module docstring); every field has its default."""

    source: str = "all"
    balance: str | None = None
    shift: str = "none"
    labels: str = "cifar10"

    @classmethod
    def from_recipe(cls, recipe: dict | None, where: str = "recipe") -> "DataVariant":
        """The variant a (resolved or unresolved) recipe declares; a one-line UserError for a bad key."""
        raw = (recipe or {}).get("data") or {}
        if not isinstance(raw, dict):
            raise UserError(f"{where}: data must be a mapping like {{source: half_a, balance: 20/80}}, got {raw!r}")
        unknown = sorted(set(raw) - {"source", "balance", "shift", "labels"})
        if unknown:
            raise UserError(f"{where}: data has unknown keys {unknown}; use source, balance, shift, labels")
        v = cls(source=str(raw.get("source", "all")), balance=None if raw.get("balance") is None else str(raw["balance"]),
                shift=str(raw.get("shift", "none")), labels=str(raw.get("labels", "cifar10")))
        if v.source not in SOURCES:
            raise UserError(f"{where}: data source {v.source!r} is not one of {', '.join(SOURCES)}")
        if v.balance is not None and v.balance not in BALANCE_LEVELS:
            raise UserError(f"{where}: balance {v.balance!r} is not one of DUMB's levels {', '.join(BALANCE_LEVELS)}")
        if v.shift != "none" and v.shift not in SHIFTS:
            raise UserError(f"{where}: shift {v.shift!r} is not one of none, {', '.join(SHIFTS)}")
        if v.labels not in LABEL_SETS:
            raise UserError(f"{where}: label set {v.labels!r} is not one of {', '.join(LABEL_SETS)}")
        return v

    @property
    def is_default(self) -> bool:
        return self == DataVariant()

    def describe(self) -> str:
        """Compact text for the results table (``surrogate_data``, ``victim_data``): the fields
        that differ from the default, ``source=half_a;balance=20/80;...``; ``all`` for the default."""
        parts = [f"source={self.source}"] if self.source != "all" else []
        if self.balance is not None:
            parts.append(f"balance={self.balance}")
        if self.shift != "none":
            parts.append(f"shift={self.shift}")
        if self.labels != "cifar10":
            parts.append(f"labels={self.labels}")
        return ";".join(parts) or "all"

    @property
    def num_classes(self) -> int:
        return len(LABEL_SETS[self.labels][1])

    def label_map(self) -> torch.Tensor:
        """CIFAR-10 class → this label set's class, :data:`OUT_OF_TASK` for classes outside it (int64, 10)."""
        m = torch.tensor(LABEL_SETS[self.labels][0], dtype=torch.int64)
        return torch.where(m < 0, torch.full_like(m, OUT_OF_TASK), m)

    def pool(self, y: np.ndarray) -> np.ndarray:
        """Dataset indices of the source (``all`` or a half), in-task classes only, in dataset order."""
        in_task = np.asarray(LABEL_SETS[self.labels][0])[y] >= 0
        if self.source == "all":
            return np.flatnonzero(in_task)
        keep = np.zeros(len(y), dtype=bool)
        for c in np.unique(y):
            idx = np.flatnonzero(y == c)
            half = len(idx) // 2
            keep[idx[:half] if self.source == "half_a" else idx[half:]] = True
        return np.flatnonzero(keep & in_task)

    def select(self, y: np.ndarray, n: int | None) -> np.ndarray:
        """The training images (dataset indices, sorted) of ``n`` in all (None: the whole pool):
        the first ``n`` of the pool, or with ``balance`` the first images of every class in the
        level's proportions (per-class counts rounded down, remainders to the first classes)."""
        pool = self.pool(y)
        if self.balance is None:
            if n is not None and n > len(pool):
                raise UserError(f"train_subset={n} exceeds the {len(pool)} images of data source {self.describe()!r}")
            return pool if n is None else pool[:n]
        classes = [c for c in range(10) if LABEL_SETS["cifar10"][0][c] >= 0 and LABEL_SETS[self.labels][0][c] >= 0]
        first, second = classes[:len(classes) // 2], classes[len(classes) // 2:]
        p, q = (int(s) / 100 for s in self.balance.split("/"))
        total = int(n) if n is not None else len(pool)
        want = {c: p * total / len(first) for c in first} | {c: q * total / len(second) for c in second}
        counts = {c: int(np.floor(w)) for c, w in want.items()}
        for c in classes[: total - sum(counts.values())]:
            counts[c] += 1
        out = []
        for c in classes:
            idx = pool[y[pool] == c]
            if counts[c] > len(idx):
                raise UserError(f"balance {self.balance} with train_subset={total} needs {counts[c]} images of "
                                f"class {c}; data source {self.source!r} has {len(idx)}: lower train_subset")
            out.append(idx[:counts[c]])
        return np.sort(np.concatenate(out))


def apply_variant(split, variant: DataVariant, n: int | None = None):
    """A copy of ``split`` (an :class:`advtransfer.data.Split`) holding the variant's images (selected, shifted, relabelled):
    what a recipe with this ``data`` trains on. ``n``: the recipe's ``train_subset``."""
    if variant.is_default:
        return split
    idx = variant.select(split.y, n)
    x = shift_images(np.asarray(split.x[idx]), idx, variant.shift)
    y = np.asarray(LABEL_SETS[variant.labels][0])[split.y[idx]].astype(np.int64)
    return replace(split, name=f"{split.name}[{variant.describe()}]", x=x, y=y,
                   classes=LABEL_SETS[variant.labels][1], lossless=None)


def parse_dataset_name(name: str) -> tuple[str, str]:
    """``'cifar10-colour'`` → ``('cifar10', 'colour')``; a name without a known shift suffix → ``(name, 'none')``."""
    base, sep, tail = name.rpartition("-")
    if sep and tail in SHIFTS:
        return base, tail
    return name, "none"


def shifted_split(split, shift: str):
    """The whole split with every image shifted (a grid's ``dataset: cifar10-<shift>``)."""
    if shift == "none":
        return split
    idx = np.arange(len(split))
    return replace(split, name=f"{split.name}-{shift}", x=shift_images(np.asarray(split.x), idx, shift), lossless=None)
