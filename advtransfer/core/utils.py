"""Small helpers: fractions like '8/255', hashing, atomic writes, provenance."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
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


def _no_space(exc: OSError) -> bool:
    return getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT)


def disk_full_error(path: str | os.PathLike, needed: int | None = None) -> UserError:
    """The one-line error for a full disk (ENOSPC/EDQUOT) while writing ``path``: the path, the
    space the write needed (at least, when not known in advance) and the space left there."""
    path = Path(path)
    try:
        free = shutil.disk_usage(path.parent if path.parent.exists() else Path.cwd()).free
        left = f"{_mb(free)} free there"
    except OSError:
        left = "free space unknown"
    need = f"needed {_mb(needed)}" if needed else "needed more space"
    return UserError(f"disk full while writing {path} ({need}, {left}); nothing was half-written: "
                     "free some space (or point --out / ADVTRANSFER_CACHE at another disk) and rerun to resume")


def _mb(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.1f} MiB"


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder and ``os.replace``.
    A full disk raises :func:`disk_full_error` and leaves ``path`` as it was."""
    with atomic_path(path, expected_size=len(data)) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


#: suffix of the checksum file written beside a checked file (``<name>.sha256``: hex digest)
CHECKSUM_SUFFIX = ".sha256"


def checksum_path(path: str | os.PathLike) -> Path:
    return Path(str(path) + CHECKSUM_SUFFIX)


@contextmanager
def atomic_path(path: str | os.PathLike, checksum: bool = False, expected_size: int | None = None):
    """Context manager yielding a temporary path next to ``path``; on success it replaces ``path``.

    ``checksum``: also write ``<path>.sha256`` (the new file's sha256), before the file itself is
    renamed into place, so a file and a checksum that disagree mean corruption or a write cut
    short, never a good file (see :func:`checksum_matches`). A full disk (ENOSPC) raises one-line
    :func:`disk_full_error` naming ``path``; the temporary file is removed either way."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=p.suffix, dir=p.parent)
        os.close(fd)
    except OSError as exc:
        if _no_space(exc):
            raise disk_full_error(p, expected_size) from None
        raise
    tmp = Path(tmp)
    try:
        try:
            yield tmp
            if checksum:
                atomic_write_bytes(checksum_path(p), (sha256_file(tmp) + "\n").encode())
            os.replace(tmp, p)
        except OSError as exc:
            if not _no_space(exc):
                raise
            written = tmp.stat().st_size if tmp.exists() else 0
            raise disk_full_error(p, expected_size or (written or None)) from None
    finally:
        tmp.unlink(missing_ok=True)


def checksum_matches(path: str | os.PathLike) -> bool | None:
    """True if ``path`` matches its ``.sha256`` file, False if not (corrupt, truncated, or its
    write was cut short), None if it has no checksum file (written before checksums existed)."""
    c = checksum_path(path)
    if not c.is_file():
        return None
    try:
        expected = c.read_text().strip()
    except OSError:
        return False
    return sha256_file(path) == expected


def remove_checked(path: str | os.PathLike) -> None:
    """Delete a checked file and its checksum file (a corrupt cache entry about to be rebuilt)."""
    Path(path).unlink(missing_ok=True)
    checksum_path(path).unlink(missing_ok=True)


def git_sha(cwd: str | os.PathLike | None = None) -> str:
    """The repository's HEAD sha (with ``-dirty`` if modified), or ``unknown`` outside git."""
    cwd = cwd or Path(__file__).resolve().parents[2]  # the checkout holding advtransfer/core/utils.py
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

    from .. import __version__

    out = {"advtransfer": __version__, "torch": torch.__version__, "numpy": numpy.__version__}
    # timm's version from its installed metadata: importing timm (and torchvision with it) only to
    # read the string cost every run seconds of start-up
    from importlib.metadata import PackageNotFoundError, version

    try:
        out["timm"] = version("timm")
    except PackageNotFoundError:
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


@contextmanager
def temp_env(**values: Any):
    """Set environment variables (values turned into strings) for the block, then restore them."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
