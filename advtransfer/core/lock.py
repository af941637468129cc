"""One writer per run folder.

``RUN/run.lock`` is held with an OS file lock (``flock``, through filelock) for as long as a
command writes the folder; ``RUN/lock.json`` names the holder (pid, host, command, start time).
A second command on the same folder stops at once with one line naming the holder. The kernel
drops the lock when its process dies, however it dies (``kill -9`` included), so a killed run
never leaves a lock that blocks: the next run takes it and overwrites the stale ``lock.json``.
(On network file systems without working ``flock`` use separate run folders per machine.)
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from .errors import UserError
from .utils import atomic_write_text

LOCK_FILE = "run.lock"
HOLDER_FILE = "lock.json"


def _holder(run_dir: Path, wait_s: float = 2.0) -> str:
    """Name the lock's holder from ``lock.json``.

    The holder writes that file just after taking the lock, so a second command that arrives in
    between waits up to ``wait_s`` seconds for it before saying the holder is unnamed."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            h = json.loads((run_dir / HOLDER_FILE).read_text())
            return (f"pid {h.get('pid')} on {h.get('host')} since {h.get('started')} "
                    f"({h.get('command', 'advtransfer')})")
        except (OSError, ValueError):
            if time.monotonic() >= deadline:
                return "another process (its lock.json is not written yet)"
            time.sleep(0.05)


class RunLock:
    """Context manager: hold ``run_dir``'s lock or raise a one-line :class:`UserError`.

    ``what`` is recorded as the holder's command (default: this process's command line)."""

    def __init__(self, run_dir: str | os.PathLike, what: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.what = what or " ".join(["advtransfer", *sys.argv[1:]])
        self._lock = None

    def __enter__(self) -> "RunLock":
        from filelock import FileLock, Timeout

        self.run_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self.run_dir / LOCK_FILE), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise UserError(f"run folder {self.run_dir} is in use by {_holder(self.run_dir)}; wait for it to "
                            "finish (or stop it), or give another --out") from None
        self._lock = lock
        atomic_write_text(self.run_dir / HOLDER_FILE, json.dumps({
            "pid": os.getpid(), "host": socket.gethostname(), "command": self.what,
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}))
        return self

    def __exit__(self, *exc) -> None:
        if self._lock is not None:
            (self.run_dir / HOLDER_FILE).unlink(missing_ok=True)
            self._lock.release()
            self._lock = None


_HELD: dict[str, int] = {}  # training locks this process holds (path -> depth): nested entries re-enter


class TrainLock:
    """Context manager: one process at a time prepares zoo entry ``name`` at ``size`` in a cache.

    Two commands sharing a cache (two grids at once, array jobs on a cluster) would
    otherwise both train a missing model: the same weights twice, at twice the cost. The lock is an
    OS file lock on ``<cache zoo folder>/.locks/<name>.lock`` (dropped by the kernel however its
    holder dies); a second process waits for it, saying so once through ``log``, and then finds
    the model trained. Re-entrant within a process (an entry's dependencies take their own)."""

    def __init__(self, lock_path: str | os.PathLike, name: str, log: Callable[[str], object] = print) -> None:
        self.path = Path(lock_path)
        self.name = name
        self.log = log
        self._lock = None

    def __enter__(self) -> "TrainLock":
        from filelock import FileLock, Timeout

        key = str(self.path)
        if _HELD.get(key):
            _HELD[key] += 1
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(key)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            self.log(f"{self.name}: another process is preparing it in this cache ({self.path}); waiting for it")
            lock.acquire()
        self._lock = lock
        _HELD[key] = 1
        return self

    def __exit__(self, *exc) -> None:
        key = str(self.path)
        _HELD[key] -= 1
        if _HELD[key] == 0 and self._lock is not None:
            del _HELD[key]
            self._lock.release()
            self._lock = None
