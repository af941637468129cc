"""Fault injection for the interruption tests: ``ADVTRANSFER_KILL_AT=<point>[:<k>]`` makes the
process kill itself with SIGKILL (no cleanup, no ``finally``) the k-th time (default 1) it passes
``point``. Unset (always, outside tests) :func:`point` returns at once.

Points: ``trained`` (models ready), ``adv_saved`` (a cell's examples cached), ``samples_written``
(its per-image table), ``shard_written`` (its rows), ``merge`` (between results.parquet and
results.csv), ``epoch_start`` (each training epoch; the k-th comes after k-1 epochs' resume
state was saved). With ``ADVTRANSFER_KILL_ONCE=<file>`` only the first process to create that file
is killed (a worker of the local executor, say, whose cells the retry then finishes).

``ADVTRANSFER_FAIL_AT=<point>[:<key>]`` makes :func:`fail` raise :class:`InjectedFault` at ``point``
(``cell``: a cell on an executor's worker; ``key``: only that cell id), every time, or, with
``ADVTRANSFER_FAIL_ONCE=<file>``, only in the first process to create that file (a failure the
executor's retry then recovers).
"""
from __future__ import annotations

import os
import signal

from .config import env

_seen: dict[str, int] = {}


def point(name: str) -> None:
    spec = env("ADVTRANSFER_KILL_AT")
    if not spec:
        return
    where, _, k = spec.partition(":")
    if where != name:
        return
    _seen[name] = _seen.get(name, 0) + 1
    if _seen[name] == int(k or 1) and _first_to_claim(env("ADVTRANSFER_KILL_ONCE")):
        os.kill(os.getpid(), signal.SIGKILL)


def _first_to_claim(marker: str | None) -> bool:
    """True without a marker file; with one, True only for the first process to create it."""
    if not marker:
        return True
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


class InjectedFault(RuntimeError):
    """The failure :func:`fail` raises."""


def fail(name: str, key: str = "") -> None:
    where, _, only = (env("ADVTRANSFER_FAIL_AT") or "").partition(":")
    if where != name or (only and only != key):
        return
    if not _first_to_claim(env("ADVTRANSFER_FAIL_ONCE")):
        return
    raise InjectedFault(f"injected failure at {name!r} (ADVTRANSFER_FAIL_AT)")
