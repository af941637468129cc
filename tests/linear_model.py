"""A two-class linear classifier whose decision boundary is known in closed form, shared by the
minimal-distortion and black-box tests."""
from __future__ import annotations

import torch
import torch.nn as nn


class Linear2(nn.Module):
    """Two-class linear classifier on flattened images: logits (0, w·x + b); class 1 iff
    w·x + b > 0. Counts every image it is shown (``seen``: the harness's queries)."""

    def __init__(self, w: torch.Tensor, b: float) -> None:
        super().__init__()
        self.w, self.b, self.seen = w, b, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += len(x)
        f = x.flatten(1).double() @ self.w.double() + self.b
        return torch.stack([torch.zeros_like(f), f], 1)
