"""Minimal distortion along the transfer direction: bisection against a linear classifier whose
boundary along δ is known in closed form, exact query counts, the cap, and the summary curves."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from advtransfer.analysis.measures.distortion import (curve_auc, linf_grid, min_scale_search, success_curve,
                                                      summarize)
from advtransfer.errors import UserError
from linear_model import Linear2


def _setup(t_star: list[float], seed: int = 0):
    """Images in the interior (0.45..0.55) labelled 0 (f < 0) and directions δ with ‖δ‖∞ = 0.1,
    w·δ > 0, scaled so the sign flips exactly at t_star[i]; clipping never acts (x + 4δ ∈ [0.05, 0.95])."""
    g = torch.Generator().manual_seed(seed)
    d = 48
    w = torch.randn(d, generator=g, dtype=torch.float64)
    n = len(t_star)
    x = 0.45 + 0.1 * torch.rand(n, d, generator=g, dtype=torch.float64)
    delta = torch.sign(w).expand(n, d) * 0.01 * torch.rand(n, d, generator=g, dtype=torch.float64)
    delta[:, 0] = 0.1 * torch.sign(w[0])              # ‖δ‖∞ = 0.1 exactly
    wd = delta @ w                                   # > 0
    # one bias for all images, then a small shift of each x along w so that f(x_i) = -t*_i · w·δ_i
    f_target = -torch.tensor(t_star, dtype=torch.float64) * wd
    b = float((f_target - x @ w).mean())
    x = x + ((f_target - (x @ w + b)) / (w @ w))[:, None] * w[None, :]
    assert x.min() > 0.3 and x.max() < 0.7
    assert (x + 4 * delta).min() > 0 and (x + 4 * delta).max() < 1
    model = Linear2(w, b)
    t_exact = -(x @ w + b) / (delta @ w)             # closed form; equals t_star
    shape = (n, 3, 4, 4)
    return model, x.view(shape), (x + delta).view(shape), t_exact


def test_bisection_finds_the_linear_boundary_within_tolerance_and_counts_queries():
    t_star = [0.3, 0.77, 1.5, 3.2, 5.0]
    model, x, x_adv, t_exact = _setup(t_star)
    assert torch.allclose(t_exact, torch.tensor(t_star, dtype=torch.float64))
    y = torch.zeros(len(x), dtype=torch.int64)
    # rel_tol 0, abs_tol = ‖δ‖∞/64 -> scale tolerance 1/64 (plus float slack): a bracket of width
    # 1 needs 6 halvings, one of width 2 ([2, 4]) needs 7
    out = min_scale_search(model, x, x_adv, y, cap=4.0, rel_tol=0.0, abs_tol=0.1 / 64 * (1 + 1e-9))
    t = out["min_scale"]
    for i in range(4):  # found point is fooled (t >= t*) and within the scale tolerance
        assert t_exact[i] <= t[i] <= t_exact[i] + 1 / 64 + 1e-12, (i, float(t[i]), float(t_exact[i]))
    assert math.isinf(float(t[4])) and math.isinf(float(out["min_linf"][4]))
    # queries: t=0, bracket (1 | 1,2 | 1,2,4), then the halvings; beyond the cap: 0,1,2,4 only
    assert out["queries"].tolist() == [1 + 1 + 6, 1 + 1 + 6, 1 + 2 + 6, 1 + 3 + 7, 1 + 3]
    assert int(out["queries"].sum()) == model.seen   # every forward row counted, nothing else
    # no clipping: min_linf = t·‖δ‖∞, min_l2 = t·‖δ‖₂
    dl2 = (x_adv - x).flatten(1).norm(dim=1)
    assert torch.allclose(out["min_linf"][:4], t[:4] * 0.1, rtol=1e-5)
    assert torch.allclose(out["min_l2"][:4], t[:4] * dl2[:4], rtol=1e-5)


def test_relative_tolerance_and_already_fooled_and_zero_direction():
    model, x, x_adv, t_exact = _setup([0.3, 2.5, 0.6])
    y = torch.zeros(3, dtype=torch.int64)
    y[2] = 1                                           # image 2 is misclassified at t = 0
    out = min_scale_search(model, x, x_adv, y, rel_tol=1 / 64, abs_tol=0.0)
    for i in range(2):
        assert t_exact[i] <= out["min_scale"][i] <= t_exact[i] * (1 + 1 / 63) + 1e-12
    assert float(out["min_scale"][2]) == 0.0 and float(out["min_l2"][2]) == 0.0
    assert int(out["queries"][2]) == 1
    # x_adv == x: never fooled away from x -> inf after the single t=0 query
    out0 = min_scale_search(model, x[:1], x[:1].clone(), y[:1])
    assert math.isinf(float(out0["min_scale"][0])) and int(out0["queries"][0]) == 1


def test_targeted_and_bad_input():
    model, x, x_adv, t_exact = _setup([0.4])
    out = min_scale_search(model, x, x_adv, torch.ones(1, dtype=torch.int64), targeted=True,
                           rel_tol=0, abs_tol=0.1 / 256)
    assert t_exact[0] <= out["min_scale"][0] <= t_exact[0] + 1 / 256 + 1e-12
    with pytest.raises(UserError):
        min_scale_search(model, x, x_adv, torch.zeros(1, dtype=torch.int64), cap=0)
    with pytest.raises(UserError):
        min_scale_search(model, x, x_adv, torch.zeros(1, dtype=torch.int64), rel_tol=0, abs_tol=0)


def test_curves_monotone_and_auc_hand_computed():
    d = np.array([0.0, 1 / 255, 4 / 255, 8 / 255, np.inf])
    g = linf_grid(16 / 255, 17)
    c = success_curve(d, g)
    assert np.all(np.diff(c) >= 0)
    assert c[0] == 0.2 and c[-1] == 0.8               # inf never counts
    # hand: S = .2 on [0,1), .4 on [1,4), .6 on [4,8), .8 on [8,16] (in /255, grid step 1/255)
    # area of that step function 10.2/16; the trapezoid on the 1/255 grid joins each jump (at 1, 4,
    # 8: S counts min_dist <= r, so S jumps at the grid point) by a ramp from the left: +0.1 each
    exact = (0.2 * 1 + 0.4 * 3 + 0.6 * 4 + 0.8 * 8 + 3 * 0.5 * 0.2) / 16
    assert curve_auc(g, c) == pytest.approx(exact)
    s = summarize(d, d * 10, [True] * 5)
    assert s["median_min_linf"] == pytest.approx(4 / 255) and s["n_fooled_within_cap"] == 4
    assert math.isinf(summarize(d, d, [False, False, False, True, True])["median_min_linf"]) is False
    assert math.isinf(summarize(d, d, [False, False, False, False, True])["median_min_linf"])
