"""HopSkipJump yardstick: exact query budgets, and on a linear classifier (where the minimal L2
distance to the boundary is |w·x + b| / ‖w‖₂ in closed form) it never beats that bound and gets close."""
from __future__ import annotations

import pytest
import torch

from advtransfer.analysis.measures.blackbox import hsja
from advtransfer.core.errors import UserError
from linear_model import Linear2


def _linear(n: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(48, generator=g, dtype=torch.float64)
    x = 0.4 + 0.2 * torch.rand(n, 48, generator=g, dtype=torch.float64)
    b = -float((x @ w).max()) - 0.5                      # every image in class 0, boundary 0.5+ away in w·x
    dist = -(x @ w + b) / w.norm()                       # exact minimal L2 distance (no clipping needed:
    assert float(dist.max()) < 0.35                      # the foot of the perpendicular stays in [0,1])
    return Linear2(w, b), x.float().view(n, 3, 4, 4), torch.zeros(n, dtype=torch.int64), dist


def test_hsja_budget_exact_and_bounded_by_the_true_distance():
    model, x, y, dist = _linear()
    out = hsja(model, x, y, budgets=(100, 1000), norm="l2", seed=0)
    assert out["queries"].tolist() == [1000] * 4          # exactly the largest budget per image
    assert model.seen == 4000                            # every query counted, nothing else sent
    l2_100, l2_1000 = out["min_l2"]
    assert torch.all(l2_1000 <= l2_100)                  # more queries never hurt (best-so-far)
    # never below the true minimum (float slack), and close to it after 1000 queries in 48 dims
    assert torch.all(l2_1000 >= dist * (1 - 1e-4))
    assert torch.all(l2_1000 <= dist * 1.25), (l2_1000 / dist).tolist()
    # L∞ variant: the exact minimal L∞ distance of a linear model is |f(x)| / ‖w‖₁
    out_inf = hsja(model, x, y, budgets=(300,), norm="linf", seed=0)
    exact_inf = dist * model.w.norm() / model.w.abs().sum()
    assert out_inf["queries"].tolist() == [300] * 4
    assert torch.all(out_inf["min_linf"][0] >= exact_inf * (1 - 1e-4))
    assert torch.all(out_inf["min_linf"][0] <= exact_inf * 3)


def test_hsja_misclassified_and_seeded_and_bad_input():
    model, x, y, _ = _linear(3)
    y2 = y.clone()
    y2[1] = 1                                            # already wrong: one query, distortion 0
    out = hsja(model, x, y2, budgets=(50,), seed=3, index=torch.tensor([7, 8, 9]))
    assert out["queries"].tolist() == [50, 1, 50] and float(out["min_l2"][0, 1]) == 0.0
    again = hsja(model, x[[2]], y2[[2]], budgets=(50,), seed=3, index=torch.tensor([9]))
    assert torch.allclose(again["min_l2"][0], out["min_l2"][0, [2]])   # batch-independent, seeded
    with pytest.raises(UserError):
        hsja(model, x, y, budgets=(0,))
    with pytest.raises(UserError):
        hsja(model, x, y, norm="l1")

