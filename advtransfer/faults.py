"""Fault injection for the interruption tests: ``ADVTRANSFER_KILL_AT=<point>[:<k>]`` makes the
process kill itself with SIGKILL (no cleanup, no ``finally``) the k-th time (default 1) it passes
``point``. Unset (always, outside tests) :func:`point` returns at once.

Points: ``trained`` (models ready), ``adv_saved`` (a cell's examples cached), ``samples_written``
(its per-image table), ``shard_written`` (its rows), ``merge`` (between results.parquet and
results.csv).
"""
from __future__ import annotations

import os
import signal

_seen: dict[str, int] = {}


def point(name: str) -> None:
    spec = os.environ.get("ADVTRANSFER_KILL_AT")
    if not spec:
        return
    where, _, k = spec.partition(":")
    if where != name:
        return
    _seen[name] = _seen.get(name, 0) + 1
    if _seen[name] == int(k or 1):
        os.kill(os.getpid(), signal.SIGKILL)
