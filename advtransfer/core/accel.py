"""Speed options of a grid run that change no algorithm: mixed precision while crafting, a
compiled surrogate where timing says it is faster, and batches halved on out-of-memory.

- ``precision`` (grid key / ``--precision``): ``fp32`` (default), ``bf16`` or ``fp16``. The
  surrogate passes of crafting run under :func:`torch.autocast`; victims are always evaluated in
  fp32 under inference mode, so the measured success rates are full-precision measurements of the
  examples. fp16 needs CUDA; bf16 also runs on a CPU (slow where the CPU lacks bf16 units, which
  is why it is an option). A precision other than fp32 enters the cell id: its examples differ.
  It applies to the per-image kinds' crafting; kinds with their own craft protocol (universal)
  craft in fp32, and their rows say so.
- ``compile`` (grid key / ``--compile``): ``off`` (default) or ``auto``. ``auto`` times, at the start
  of a run, a few input-gradient passes of each single surrogate model eager and compiled
  (:func:`torch.compile`) on a batch of the run's images, and keeps the compiled one only where it
  was faster (so never slower than eager, up to timing noise); the choice is recorded in the row
  (column ``compile``). Attacks that hook into a model's layers (SGM, LinBP, PAS, the feature
  attacks) always use the eager model: hooks added after compilation are not seen by the graph.
- Batches: a pass that runs out of accelerator memory is retried with half the batch (down to
  one image), and the run goes on with that size; the size used is recorded in the row
  (column ``batch_used``) and in the run log.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn

from .errors import UserError

PRECISIONS = ("fp32", "bf16", "fp16")
COMPILE_MODES = ("off", "auto")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(precision: str, device: str) -> None:
    """Refuse a precision this device cannot run (one clear line). Whether ``precision`` is one of
    :data:`PRECISIONS` is :meth:`advtransfer.grid.GridSpec.validate`'s check."""
    if precision == "fp16" and not str(device).startswith("cuda"):
        raise UserError("precision fp16 needs a CUDA device (float16 autocast is a GPU feature); "
                        "use --precision bf16 on a CPU, or fp32")


@contextlib.contextmanager
def autocast(precision: str, device: str) -> Iterator[None]:
    """Mixed precision for the surrogate passes of crafting (a no-op for ``fp32``)."""
    if precision == "fp32":
        yield
        return
    with torch.autocast(device_type=torch.device(device).type, dtype=_DTYPES[precision]):
        yield


def is_oom(err: BaseException) -> bool:
    """Whether ``err`` is an out-of-memory error of an accelerator (CUDA's, or another backend's)."""
    if isinstance(err, torch.OutOfMemoryError):
        return True
    return isinstance(err, RuntimeError) and "out of memory" in str(err).lower()


class BatchPlan:
    """A batch size that halves when a pass runs out of memory and stays halved afterwards.

    ``run(fn, n)`` calls ``fn(start, stop)`` over ``range(n)`` in chunks of the current size;
    on an out-of-memory error the same chunk is retried with half the size (an error at size 1
    is raised). ``fn`` must be a pure function of its chunk (the chunk is recomputed).
    ``halvings`` lists (old, new) sizes; ``log`` is told of each. ``fixed``: the size must not
    change (the results depend on the batches); an out-of-memory error is then a UserError
    ending with this text."""

    def __init__(self, size: int, log: Callable[[str], None] | None = None, what: str = "batch",
                 fixed: str | None = None) -> None:
        if size < 1:
            raise ValueError("batch size must be >= 1")
        self.size, self.log, self.what, self.fixed = int(size), log, what, fixed
        self.halvings: list[tuple[int, int]] = []

    def run(self, fn: Callable[[int, int], Any], n: int) -> list[Any]:
        out, s = [], 0
        while s < n:
            stop = min(n, s + self.size)
            try:
                out.append(fn(s, stop))
            except Exception as err:  # noqa: BLE001 - only out-of-memory errors are handled
                if not is_oom(err) or self.size == 1:
                    raise
                if self.fixed:
                    from .errors import UserError

                    raise UserError(f"out of memory at {self.what} size {self.size}: {self.fixed}") from None
                old, self.size = self.size, max(1, self.size // 2)
                self.halvings.append((old, self.size))
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                if self.log is not None:
                    self.log(f"out of memory at {self.what} size {old}: going on with {self.size}")
                continue
            s = stop
        return out


def _grad_pass(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    xg = x.detach().clone().requires_grad_(True)
    loss = nn.functional.cross_entropy(model(xg), y, reduction="sum")
    torch.autograd.grad(loss, xg)
    if x.is_cuda:
        torch.cuda.synchronize(x.device)


def time_passes(fns: dict[str, Callable[[], None]], rounds: int = 5) -> dict[str, float]:
    """Median wall time (s) of each function, interleaved round by round (noise hits all alike)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def choose_compiled(model: nn.Module, x: torch.Tensor, y: torch.Tensor, rounds: int = 5,
                    min_gain: float = 1.02, compiler: Callable[[nn.Module], nn.Module] | None = None,
                    timer: Callable[[dict[str, Callable[[], None]], int], dict[str, float]] = time_passes
                    ) -> tuple[nn.Module, dict[str, Any]]:
    """(the module to attack, what was measured). Times input-gradient passes of ``model`` on the
    batch ``x`` (pixels in [0,1], N×C×H×W) with labels ``y``, eager against compiled (first call,
    which compiles, not timed), and returns the compiled module only where its median pass was at
    least ``min_gain`` times faster. The info dict: choice (``compiled`` / ``eager`` /
    ``eager (compile failed: …)``), eager_ms, compiled_ms, compile_s."""
    compiler = compiler or (lambda m: torch.compile(m))
    t0 = time.perf_counter()
    try:
        compiled = compiler(model)
        _grad_pass(compiled, x, y)  # compiles forward and backward
    except Exception as err:  # noqa: BLE001 - a backend that cannot compile leaves the model eager
        return model, {"choice": f"eager (compile failed: {type(err).__name__})", "eager_ms": float("nan"),
                       "compiled_ms": float("nan"), "compile_s": time.perf_counter() - t0}
    compile_s = time.perf_counter() - t0
    _grad_pass(model, x, y)  # warm the eager path too
    med = timer({"eager": lambda: _grad_pass(model, x, y), "compiled": lambda: _grad_pass(compiled, x, y)}, rounds)
    faster = med["eager"] >= min_gain * med["compiled"]
    return (compiled if faster else model), {"choice": "compiled" if faster else "eager",
                                             "eager_ms": 1000 * med["eager"], "compiled_ms": 1000 * med["compiled"],
                                             "compile_s": compile_s}
