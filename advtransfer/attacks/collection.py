"""The protocol of a multi-sample surrogate (LGV snapshots, cSGLD samples, SWAG, posterior
smoothing), in a module of its own so that the layer tools can recognise one without importing
the attack base (:mod:`advtransfer.attacks.base` re-exports it)."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class ModelCollection(Protocol):
    """A multi-sample surrogate used as one member of a :class:`SurrogateSet` (LGV snapshots,
    cSGLD samples, SWAG, posterior smoothing: :mod:`advtransfer.models.collections`).

    Per attack iteration it draws K = ``evals_per_call`` weight sets; ``reset()`` reseeds the
    draws (at the start of every attack call), ``advance()`` moves to the next iteration's draws,
    ``draw_logits(x, k)`` gives the logits (N×classes) of draw k (0..K−1), ``step_logits(x)`` those
    of all K draws of the iteration, ``mean_logits(x)`` the prediction of the whole collection.
    Inputs are pixels in [0,1], N×C×H×W.
    """

    @property
    def evals_per_call(self) -> int: ...

    def reset(self) -> None: ...

    def advance(self) -> None: ...

    def draw_logits(self, x: torch.Tensor, k: int) -> torch.Tensor: ...

    def step_logits(self, x: torch.Tensor) -> list[torch.Tensor]: ...

    def mean_logits(self, x: torch.Tensor) -> torch.Tensor: ...
