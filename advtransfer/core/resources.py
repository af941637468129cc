"""Where the harness finds its shipped files: the grids (``grids/``), the model catalogues
(``surrogates/``, ``victims/``), the shipped weights (``zoo/``), and where runs go by default.

In a source checkout (the package sits beside ``pyproject.toml`` and the top-level folders) the
top-level folders are used, so edits to them take effect at once. From an installed wheel the
copies packaged as ``advtransfer/_data/{grids,surrogates,victims,zoo}`` are used (pyproject maps the
top-level folders there; nothing is duplicated in the repository).
"""
from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # advtransfer/ (this file is advtransfer/core/resources.py)
DATA_FOLDERS = ("grids", "surrogates", "victims")


def source_root() -> Path | None:
    """The checkout that holds this package, or None when it runs from an installed copy."""
    root = PACKAGE_DIR.parent
    if (root / "pyproject.toml").is_file() and all((root / d).is_dir() for d in DATA_FOLDERS):
        return root
    return None


def data_root() -> Path:
    """The folder holding ``grids/``, ``surrogates/`` and ``victims/``."""
    return source_root() or PACKAGE_DIR / "_data"


def grids_dir() -> Path:
    """Folder of the named grids (``ci`` → ``grids_dir() / 'ci.yaml'``)."""
    return data_root() / "grids"


def catalogue_dirs() -> list[Path]:
    """Folders of the shipped model catalogues: surrogates, then victims."""
    root = data_root()
    return [root / "surrogates", root / "victims"]


def results_dir() -> Path:
    """Parent of default run folders: ``results/`` of the checkout, else ``./results`` under the
    current working directory (an installed package has no folder of its own to write to)."""
    root = source_root()
    return root / "results" if root is not None else Path.cwd() / "results"


def shipped_zoo_root() -> Path:
    """Folder of the weights and cards shipped with the project: ``zoo/<size>/`` (the converged
    zoo, trained once and committed so that a fresh clone attacks it at once)."""
    return data_root() / "zoo"


def portable_path(path: str | Path | None) -> str | None:
    """``path`` as committed records and packs may name it: relative to the project's checkout (or the
    working folder) when inside it, else its file name alone, so no record names the folders of
    the machine that ran it."""
    if path is None:
        return None
    p = Path(path)
    if not p.is_absolute():
        return p.as_posix()
    for root in (source_root(), Path.cwd()):
        if root is not None and p.resolve().is_relative_to(Path(root).resolve()):
            return p.resolve().relative_to(Path(root).resolve()).as_posix()
    return p.name
