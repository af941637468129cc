"""Datasets as float tensors in [0, 1], NCHW, with labels and dataset indices.

CIFAR-10 sources, in order:
1. a folder given explicitly (``--data-dir``) or by ``$ADVTRANSFER_DATA`` holding ``train.npz`` and
   ``test.npz`` (arrays ``x`` uint8 N×32×32×3, ``y`` int64, optional ``classes``);
2. torchvision's download into the cache folder (needs internet), converted once to that format;
3. otherwise a one-line :class:`UserError` naming both ways out.
"""
from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from ..core.config import cache_dir, data_dir_setting, imagenet_image_size, imagenet_root
from ..core.errors import UserError

CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)


@dataclass(frozen=True)
class Split:
    """One split of a dataset kept as uint8 NHWC (compact); use :meth:`tensors` for floats."""

    name: str
    split: str
    x: np.ndarray  # uint8, N×H×W×C
    y: np.ndarray  # int64, N
    classes: tuple[str, ...]
    lossless: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.y)

    def tensors(self, index: np.ndarray | torch.Tensor | slice | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return ``(x, y, index)``: x float32 N×C×H×W in [0,1], y int64 N, index int64 N."""
        if index is None:
            idx = np.arange(len(self.y))
        elif isinstance(index, slice):
            idx = np.arange(len(self.y))[index]
        else:
            idx = np.asarray(index, dtype=np.int64)
        x = torch.from_numpy(np.ascontiguousarray(self.x[idx])).permute(0, 3, 1, 2).float().div_(255.0)
        y = torch.from_numpy(self.y[idx].astype(np.int64))
        return x.contiguous(), y, torch.from_numpy(idx.astype(np.int64))


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The CIFAR-10 npz folder to use: the argument, else $ADVTRANSFER_DATA, else None."""
    chosen = data_dir or data_dir_setting()
    if not chosen:
        return None
    path = Path(chosen).expanduser()
    missing = [f for f in ("train.npz", "test.npz") if not (path / f).is_file()]
    if missing:
        raise UserError(
            f"data folder {str(path)!r} lacks {', '.join(missing)}; point --data-dir or "
            "ADVTRANSFER_DATA at a folder with CIFAR-10 train.npz/test.npz"
        )
    return path


def _download_cifar10(root: Path) -> Path:
    """Download CIFAR-10 with torchvision into ``root`` and convert it to the npz format."""
    out = root / "cifar10"
    if (out / "train.npz").is_file() and (out / "test.npz").is_file():
        return out
    try:
        from torchvision.datasets import CIFAR10

        sets = {s: CIFAR10(str(root / "torchvision"), train=(s == "train"), download=True)
                for s in ("train", "test")}
    except Exception as exc:  # no internet, no space, ...
        raise UserError(
            "CIFAR-10 not found and the torchvision download failed "
            f"({type(exc).__name__}); pass --data-dir or set ADVTRANSFER_DATA to a folder with "
            "train.npz/test.npz (e.g. ../shared/data/cifar10), or run once with internet"
        ) from None
    out.mkdir(parents=True, exist_ok=True)
    for s, ds in sets.items():
        tmp = out / f".{s}.npz.tmp"
        with open(tmp, "wb") as fh:
            np.savez(fh, x=ds.data.astype(np.uint8), y=np.asarray(ds.targets, dtype=np.int64),
                     classes=np.asarray(ds.classes), lossless=np.ones(len(ds.targets), bool))
        os.replace(tmp, out / f"{s}.npz")
    return out


@lru_cache(maxsize=8)
def _load_npz(path: str) -> tuple[np.ndarray, np.ndarray, tuple[str, ...], np.ndarray | None]:
    try:
        with np.load(path, allow_pickle=False) as z:
            x, y = z["x"], z["y"].astype(np.int64)
            classes = tuple(str(c) for c in z["classes"]) if "classes" in z.files else CIFAR10_CLASSES
            lossless = z["lossless"] if "lossless" in z.files else None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"cannot read {path!r} as a CIFAR-10 npz file ({why}); the file is truncated or corrupt: "
                        "restore it (or delete the folder's npz files and let torchvision download them)") from None
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[-1] != 3 or y.ndim != 1 or len(x) != len(y):
        raise UserError(f"{path!r} must hold x uint8 N×H×W×3 and y with one label per image; it holds x "
                        f"{x.dtype} {tuple(x.shape)} and y {tuple(y.shape)}")
    if len(y) and (y.min() < 0 or y.max() >= len(classes)):
        raise UserError(f"{path!r}: labels must lie in 0..{len(classes) - 1}, found {int(y.min())}..{int(y.max())}")
    return x, y, classes, lossless


def load_cifar10(split: str = "test", data_dir: str | os.PathLike | None = None,
                 cache: str | os.PathLike | None = None) -> Split:
    """Load a CIFAR-10 split ('train' or 'test'); see the module docstring for the sources."""
    if split not in ("train", "test"):
        raise UserError(f"unknown split {split!r}; use 'train' or 'test'")
    folder = resolve_data_dir(data_dir)
    if folder is None:
        folder = _download_cifar10(cache_dir(cache) / "data")
    x, y, classes, lossless = _load_npz(str(folder / f"{split}.npz"))
    return Split("cifar10", split, x, y, classes, lossless)


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".ppm")


class FolderImages:
    """Images of an image folder, read on demand: ``images[idx]`` → uint8 array N×S×S×3.

    Each image is converted to RGB, its shorter side resized to ``size`` (bicubic) and the centre
    S×S square kept, so every image has the same shape; the models' own resize/crop (their data
    config) happens inside the model wrappers.
    """

    def __init__(self, files: list[Path], size: int) -> None:
        self.files, self.size = files, int(size)

    def __len__(self) -> int:
        return len(self.files)

    def load(self, i: int) -> np.ndarray:
        from PIL import Image

        try:
            with Image.open(self.files[i]) as im:
                im = im.convert("RGB")
                w, h = im.size
                r = self.size / min(w, h)
                im = im.resize((max(self.size, round(w * r)), max(self.size, round(h * r))), Image.BICUBIC)
                w, h = im.size
                left, top = (w - self.size) // 2, (h - self.size) // 2
                return np.asarray(im.crop((left, top, left + self.size, top + self.size)), dtype=np.uint8)
        except OSError as exc:
            raise UserError(f"cannot read image {str(self.files[i])!r} ({exc})") from None

    def __getitem__(self, idx) -> np.ndarray:
        idx = np.arange(len(self.files))[idx] if isinstance(idx, slice) else np.atleast_1d(np.asarray(idx))
        out = np.empty((len(idx), self.size, self.size, 3), dtype=np.uint8)
        for j, i in enumerate(idx.tolist()):
            out[j] = self.load(int(i))
        return out


def _read_labels_file(folder: Path, path: Path) -> tuple[list[Path], list[int]]:
    files, labels = [], []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.replace(",", " ").split()
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
            raise UserError(f"{path}:{n}: expected 'relative/path.png <class index>', got {line!r}")
        files.append(folder / parts[0])
        labels.append(int(parts[1]))
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise UserError(f"{path} names {len(missing)} missing files, e.g. {str(missing[0])!r}")
    return files, labels


def load_image_folder(root: str | os.PathLike, split: str, size: int = 256, name: str = "imagefolder",
                      classes: tuple[str, ...] | None = None) -> Split:
    """An ImageNet-compatible image folder as a :class:`Split` (images read on demand).

    Layout: ``root/<split>/`` holds either a labels file (``labels.txt`` or ``labels.csv``: one
    ``relative/path <class index>`` per line) or one subfolder per class. Subfolders named by
    integers are those class indices; otherwise (ImageNet wnids) the sorted order gives the index,
    as in torchvision's ImageFolder; images are then ordered round-robin over the classes, so a
    grid's first n images cover every class (a labels file keeps its own order). Images are squared
    to ``size``×``size`` (see :class:`FolderImages`).
    """
    folder = Path(root).expanduser() / split
    if not folder.is_dir():
        raise UserError(f"image folder {str(folder)!r} does not exist; expected {str(root)!r}/<split>/ with "
                        "class subfolders or a labels.txt")
    label_files = [folder / f for f in ("labels.txt", "labels.csv") if (folder / f).is_file()]
    if label_files:
        files, labels = _read_labels_file(folder, label_files[0])
    else:
        subdirs = sorted(d for d in folder.iterdir() if d.is_dir())
        if not subdirs:
            raise UserError(f"{str(folder)!r} has neither class subfolders nor a labels.txt")
        numeric = all(d.name.isdigit() for d in subdirs)
        order = sorted(subdirs, key=lambda d: int(d.name)) if numeric else subdirs
        per_class = []
        for pos, d in enumerate(order):
            label = int(d.name) if numeric else pos
            per_class.append([(f, label) for f in sorted(d.rglob("*")) if f.suffix.lower() in IMAGE_SUFFIXES])
        # round-robin over the classes (first image of every class, then the second, ...), so that
        # the first n images of a split, as grids take them, cover the classes evenly
        ranked = sorted(((r, c, f, lab) for c, items in enumerate(per_class) for r, (f, lab) in enumerate(items)),
                        key=lambda t: (t[0], t[1]))
        files, labels = [t[2] for t in ranked], [t[3] for t in ranked]
    if not files:
        raise UserError(f"no images ({', '.join(IMAGE_SUFFIXES)}) under {str(folder)!r}")
    y = np.asarray(labels, dtype=np.int64)
    n_classes = int(y.max()) + 1
    cls = classes if classes is not None else tuple(str(i) for i in range(n_classes))
    return Split(name, split, FolderImages(files, size), y, tuple(cls))  # type: ignore[arg-type]


def load_imagenet(split: str = "val", data_dir: str | os.PathLike | None = None) -> Split:
    """ImageNet (or any 1000-class image folder) from ``$ADVTRANSFER_IMAGENET`` (or ``data_dir``
    if it has a ``<split>/`` folder): ``<root>/<split>/`` in the layout of :func:`load_image_folder`;
    images squared to ``$ADVTRANSFER_IMAGE_SIZE`` (default 256: the models crop their own 224)."""
    root = imagenet_root()
    if data_dir and (Path(data_dir) / split).is_dir():
        root = str(data_dir)
    if not root:
        raise UserError("ImageNet needs ADVTRANSFER_IMAGENET pointing at a folder with val/ (and train/ for "
                        "universal perturbations) holding class subfolders or a labels.txt")
    try:
        from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

        classes = tuple(IMAGENET_CLASSNAMES)
    except ImportError:
        classes = tuple(str(i) for i in range(1000))
    return load_image_folder(root, split, imagenet_image_size(), "imagenet", classes)


DATASETS = {"cifar10": load_cifar10, "imagenet": load_imagenet}


def load_dataset(name: str, split: str = "test", data_dir: str | os.PathLike | None = None) -> Split:
    """Load a registered dataset split by name; ``<name>-<shift>`` (e.g. ``cifar10-colour``) is the
    split with every image distribution-shifted (:mod:`advtransfer.data.variants`)."""
    from .variants import SHIFTS, parse_dataset_name

    base, shift = parse_dataset_name(name)
    if base not in DATASETS:
        from ..core.registry import suggest

        raise UserError(suggest(name, list(DATASETS) + [f"cifar10-{s}" for s in SHIFTS], "dataset"))
    if shift == "none":
        return DATASETS[base](split, data_dir=data_dir)
    return _shifted(base, shift, split, str(resolve_data_dir(data_dir) or ""))


@lru_cache(maxsize=4)
def _shifted(base: str, shift: str, split: str, data_dir: str) -> Split:
    from .variants import shifted_split

    return shifted_split(DATASETS[base](split, data_dir=data_dir or None), shift)


def eval_subset(ds: Split, n: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Deterministic evaluation subset: images ``start .. start+n-1`` as ``(x, y, index)``."""
    if n <= 0 or start < 0 or start + n > len(ds):
        raise UserError(f"subset {start}..{start + n - 1} is outside the {len(ds)} {ds.split} images")
    return ds.tensors(slice(start, start + n))
