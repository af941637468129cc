"""Process-wide settings taken from the environment (cache folder, data folder, zoo size, ...).

Every environment variable the package reads is read here and listed in :data:`ENVIRONMENT`
(the CLI's epilog prints that list; a test checks no other module reads one).
"""
from __future__ import annotations

import os
from pathlib import Path

SIZES = ("ci", "cpu", "converged", "full")
#: the zoo size when none is given anywhere (:func:`default_size`): the shipped converged zoo
DEFAULT_SIZE = "converged"
#: who runs a grid's cells (advtransfer.run.executors): here, in worker processes, or as Slurm jobs
EXECUTORS = ("serial", "local", "submitit")

#: every environment variable the package reads, with what it sets
ENVIRONMENT = {
    "ADVTRANSFER_DATA": "CIFAR-10 npz folder (train.npz, test.npz); --data-dir overrides it",
    "ADVTRANSFER_CACHE": "trained models and downloads (default ~/.cache/advtransfer); --cache-dir overrides it",
    "ADVTRANSFER_SIZE": "zoo size: ci, cpu, converged, full (default converged)",
    "ADVTRANSFER_DEVICE": "torch device (default cuda if available, else cpu); --device overrides it",
    "ADVTRANSFER_SHIPPED_ZOO": "the shipped weights' folder (default zoo/); none turns them off",
    "ADVTRANSFER_ZOO": "model catalogue folders, os.pathsep-separated (default surrogates/ and victims/)",
    "ADVTRANSFER_IMAGENET": "ImageNet folder with val/ (and train/ for universal attacks)",
    "ADVTRANSFER_IMAGE_SIZE": "side in pixels ImageNet images are squared to (default 256)",
    "ADVTRANSFER_KILL_AT": "tests: SIGKILL the process at a named point (point[:k], advtransfer.core.faults)",
    "ADVTRANSFER_KILL_ONCE": "tests: marker file, so only the first process is killed",
    "ADVTRANSFER_FAIL_AT": "tests: raise at a named point (point[:key], advtransfer.core.faults)",
    "ADVTRANSFER_FAIL_ONCE": "tests: marker file, so only the first process fails",
}


def env(name: str) -> str | None:
    """The value of the environment variable ``name`` (None when unset); only names listed in
    :data:`ENVIRONMENT` may be read."""
    if name not in ENVIRONMENT:
        raise KeyError(f"{name} is not listed in advtransfer.core.config.ENVIRONMENT")
    return os.environ.get(name)


def data_dir_setting() -> str | None:
    """$ADVTRANSFER_DATA (the CIFAR-10 npz folder), None when unset or empty."""
    return env("ADVTRANSFER_DATA") or None


def imagenet_root() -> str | None:
    """$ADVTRANSFER_IMAGENET (a folder with val/ and train/), None when unset or empty."""
    return env("ADVTRANSFER_IMAGENET") or None


def imagenet_image_size() -> int:
    """$ADVTRANSFER_IMAGE_SIZE: the side (pixels) ImageNet images are squared to, default 256."""
    value = env("ADVTRANSFER_IMAGE_SIZE")
    if value is None:
        return 256
    try:
        size = int(value)
    except ValueError:
        size = 0
    if size < 1:
        from .errors import UserError

        raise UserError(f"ADVTRANSFER_IMAGE_SIZE={value!r} must be a whole number of pixels >= 1, like 256")
    return size


def zoo_catalogue_dirs() -> list[Path] | None:
    """$ADVTRANSFER_ZOO: folders of model YAML files (os.pathsep-separated); None when unset."""
    value = env("ADVTRANSFER_ZOO")
    return [Path(p) for p in value.split(os.pathsep) if p] if value else None


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """Folder for trained models and downloads: `override`, else $ADVTRANSFER_CACHE, else ~/.cache/advtransfer."""
    if override:
        return Path(override).expanduser()
    value = env("ADVTRANSFER_CACHE")
    if value:
        return Path(value).expanduser()
    return Path.home() / ".cache" / "advtransfer"


def shipped_zoo_dir() -> Path | None:
    """Folder of the weights shipped with the project (``<size>/<name>.safetensors`` and cards):
    $ADVTRANSFER_SHIPPED_ZOO (``none`` turns it off), else ``zoo/`` of the checkout or the
    installed package (see :mod:`advtransfer.core.resources`)."""
    value = env("ADVTRANSFER_SHIPPED_ZOO")
    if value is not None:
        return None if value.strip().lower() in ("", "none") else Path(value).expanduser()
    from .resources import shipped_zoo_root

    return shipped_zoo_root()


def zoo_size(value: str | None, flag: str = "--size") -> str:
    """A command's zoo size: ``value`` when given (a UserError naming ``flag`` unless it is one of
    :data:`SIZES`), else :func:`default_size`. Grids judge their size in ``GridSpec.validate``."""
    if value is None:
        return default_size()
    if value not in SIZES:
        from .errors import UserError

        raise UserError(f"{flag} {value!r} is not a zoo size; use one of {', '.join(SIZES)}")
    return value


def default_size() -> str:
    """Zoo size used when none is given, by the Python API, every command and a grid without
    ``size:``: $ADVTRANSFER_SIZE, else :data:`DEFAULT_SIZE` (the converged zoo, whose weights ship
    with the project: nothing trains). ``cpu`` is the explicit choice of a zoo that trains."""
    size = env("ADVTRANSFER_SIZE")
    size = DEFAULT_SIZE if size is None else size
    if size not in SIZES:
        from .errors import UserError

        raise UserError(f"ADVTRANSFER_SIZE={size!r} is not a zoo size; use one of {', '.join(SIZES)}")
    return size


def default_device() -> str:
    import torch

    return env("ADVTRANSFER_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


#: CPU threads training uses unless a recipe says ``threads:``. Float summation order depends on
#: the thread count (1 and 2 threads train measurably different models), so training pins it:
#: every machine of the same kind then trains bit-identical weights. It enters the recipe hash.
DEFAULT_TRAIN_THREADS = 2


def train_threads(recipe: dict) -> int:
    """The thread count a resolved recipe trains with (``threads:``, else 2)."""
    n = recipe.get("threads", DEFAULT_TRAIN_THREADS)
    if not isinstance(n, int) or n < 1:
        from .errors import UserError

        raise UserError(f"recipe threads must be a positive integer, got {n!r}")
    return n
