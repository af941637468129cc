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


@contextmanager
def pinned_threads(n: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(n)``, then restore the caller's thread count."""
    old = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def provenance(device: str, threads: int | None = None) -> dict:
    """What determines trained weights beyond the recipe: thread count, device (and GPU name),
    deterministic-algorithm setting, processor, the CPU kernels torch dispatches to (AVX2 and
    AVX-512 kernels give different float32 bits) and library versions (see utils.versions)."""
    import platform

    info = {"threads": threads if threads is not None else torch.get_num_threads(), "device": str(device),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "machine": platform.machine(), "processor": platform.processor() or platform.machine(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    if str(device).startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
        info["cudnn_deterministic"] = bool(torch.backends.cudnn.deterministic)
    return info
