"""Seeded work without side effects on torch's global random state."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch


def _cuda_index(device: str | torch.device | None) -> list[int]:
    if device is None:
        return []
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return []
    return [dev.index if dev.index is not None else torch.cuda.current_device()]


@contextmanager
def seeded(seed: int | None, device: str | torch.device | None = None) -> Iterator[None]:
    """Run the block with torch's global CPU generator (and, for a CUDA ``device``, that device's
    generator) seeded to ``seed``, then restore the caller's states: code inside draws exactly the
    numbers ``torch.manual_seed(seed)`` would give it, and the caller's random stream is untouched.
    ``seed=None`` only isolates (draws inside continue the caller's stream, which is then restored).
    """
    devices = _cuda_index(device)
    with torch.random.fork_rng(devices=devices):
        if seed is not None:
            torch.random.default_generator.manual_seed(int(seed))
            for i in devices:
                torch.cuda.default_generators[i].manual_seed(int(seed))
        yield
