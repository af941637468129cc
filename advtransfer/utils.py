"""Small helpers: fractions like '8/255', hashing, atomic writes, provenance."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any

from .errors import UserError


def parse_fraction(value: Any, what: str = "value") -> float:
    """Parse ``8/255``, ``0.03`` or a number into a float; raise :class:`UserError` otherwise."""
    if isinstance(value, bool):
        raise UserError(f"{what} must be a number like 8/255, not {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(Fraction(str(value).strip()))
    except (ValueError, ZeroDivisionError):
        raise UserError(f"{what} {value!r} is not a number; write it like 8/255 or 0.03") from None


def eps_to_str(eps: float) -> str:
    """``8/255`` for multiples of 1/255 (to 1e-9), else a compact decimal."""
    k = eps * 255
    if abs(k - round(k)) < 1e-6 and round(k) > 0:
        return f"{int(round(k))}/255"
    return f"{eps:.6g}"


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def short_hash(obj: Any, n: int = 16) -> str:
    """Stable hex hash of a JSON-able object (sorted keys)."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:n]


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_path(path: str | os.PathLike):
    """Context manager yielding a temporary path next to ``path``; on success it replaces ``path``."""
    from contextlib import contextmanager

    @contextmanager
    def _cm():
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=p.suffix, dir=p.parent)
        os.close(fd)
        try:
            yield Path(tmp)
            os.replace(tmp, p)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    return _cm()


def git_sha(cwd: str | os.PathLike | None = None) -> str:
    """The repository's HEAD sha (with ``-dirty`` if modified), or ``unknown`` outside git."""
    cwd = cwd or Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        if not sha:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict[str, str]:
    import numpy
    import torch

    from . import __version__

    out = {"advtransfer": __version__, "torch": torch.__version__, "numpy": numpy.__version__}
    try:
        import timm

        out["timm"] = timm.__version__
    except ImportError:
        pass
    return out


def write_table(df, out_dir: str | os.PathLike, stem: str) -> list[Path]:
    """Write ``df`` as ``out_dir/<stem>.parquet`` (types kept) and ``.csv`` (diffable), each
    atomically; returns the two paths."""
    paths = [Path(out_dir) / f"{stem}.parquet", Path(out_dir) / f"{stem}.csv"]
    with atomic_path(paths[0]) as tmp:
        df.to_parquet(tmp, index=False)
    with atomic_path(paths[1]) as tmp:
        df.to_csv(tmp, index=False)
    return paths
