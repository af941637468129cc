"""Process-wide settings taken from the environment (cache folder, data folder, zoo size)."""
from __future__ import annotations

import os
from pathlib import Path

SIZES = ("ci", "cpu", "converged", "full")
#: who runs a grid's cells (advtransfer.executors): here, in worker processes, or as Slurm jobs
EXECUTORS = ("serial", "local", "submitit")


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """Folder for trained models and downloads: `override`, else $ADVTRANSFER_CACHE, else ~/.cache/advtransfer."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get("ADVTRANSFER_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "advtransfer"


def shipped_zoo_dir() -> Path | None:
    """Folder of the weights shipped with the project (``<size>/<name>.safetensors`` and cards):
    $ADVTRANSFER_SHIPPED_ZOO (``none`` turns it off), else ``zoo/`` of the checkout or the
    installed package (see :mod:`advtransfer.resources`)."""
    env = os.environ.get("ADVTRANSFER_SHIPPED_ZOO")
    if env is not None:
        return None if env.strip().lower() in ("", "none") else Path(env).expanduser()
    from .resources import shipped_zoo_root

    return shipped_zoo_root()


def default_size() -> str:
    """Zoo size used when none is given: $ADVTRANSFER_SIZE, else `cpu`."""
    size = os.environ.get("ADVTRANSFER_SIZE", "cpu")
    if size not in SIZES:
        from .errors import UserError

        raise UserError(f"ADVTRANSFER_SIZE={size!r} is not a zoo size; use one of {', '.join(SIZES)}")
    return size


def default_device() -> str:
    import torch

    return os.environ.get("ADVTRANSFER_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


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
