"""Posterior smoothing around a trained surrogate (TASAR-style weight- and input-space sampling):
fitted scales keep the stated accuracy, draws reproduce, gradients are counted per draw, and a
grid row wraps a plain zoo model and records the scales it used."""
from __future__ import annotations

import json

import pytest
import torch
import yaml

from advtransfer.attacks import SurrogateSet, create_attack
from advtransfer.core.errors import UserError
from advtransfer.models.collections import PosteriorSmoothing, check_options, fit_posterior_scales


def test_fitted_scales_keep_the_accuracy_within_the_tolerance(trained, test_data):
    model = trained("resnet20_a")
    x, y, _ = (t[:120] for t in test_data)
    ws, xs = fit_posterior_scales(model, x, y, max_drop=0.05, draws=2, iters=5)
    assert 0 < ws < 1 and 0 < xs < 0.5
    with torch.no_grad():
        base = float((model(x).argmax(1) == y).float().mean())
        coll = PosteriorSmoothing(model, ws, xs, per_step=1, seed=0)
        accs = []
        for _ in range(2):
            coll.advance()
            accs.append(float((coll.draw_logits(x, 0).argmax(1) == y).float().mean()))
        # each scale alone was fitted to cost at most 5 points; together they may cost a little more
        assert sum(accs) / 2 >= base - 0.15
        # far larger scales destroy the model: the bisection found a real edge
        coll = PosteriorSmoothing(model, min(1.0, 8 * ws), 0.0, per_step=1, seed=0)
        coll.advance()
        assert float((coll.draw_logits(x, 0).argmax(1) == y).float().mean()) < base - 0.05


def test_draws_reproduce_and_gradients_count_per_draw(trained, test_data):
    model = trained("resnet20_a")
    x, y, idx = (t[:8] for t in test_data)
    coll = PosteriorSmoothing(model, 0.05, 0.02, per_step=3, seed=1)
    S = SurrogateSet(coll)
    atk = create_attack("mifgsm", eps=8 / 255, steps=2)
    res = atk.run(S, x, y, idx)
    a = res.x_adv
    assert res.grad_evals == 2 * 3
    b = atk(S, x, y, idx)  # reseeded at every attack call
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    with torch.no_grad():  # zero scales: the draws are the model itself
        flat = PosteriorSmoothing(model, 0.0, 0.0, per_step=1)
        flat.advance()
        torch.testing.assert_close(flat.draw_logits(x, 0), model(x))
    with pytest.raises(UserError, match="posterior must be gaussian"):
        check_options({"posterior": "laplace"})
    with pytest.raises(UserError, match="need posterior: gaussian"):
        check_options({"weight_scale": 0.1})


def test_grid_row_wraps_a_plain_model_and_records_its_scales(tmp_path, cache_dir):
    from advtransfer.cli import main
    from advtransfer.run.store import RunStore

    grid = {"name": "post", "n": 16, "size": "ci", "eps": ["8/255"], "defaults": {"steps": 2},
            "attacks": {"mifgsm": {}},
            "surrogates": [{"models": ["resnet20_a"], "name": "resnet20_a_smooth", "posterior": "gaussian",
                            "weight_scale": 0.05, "input_scale": 0.02, "per_step": 2}],
            "victims": ["resnet20_b"]}
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(grid))
    out = tmp_path / "run"
    assert main(["grid", str(path), "--out", str(out), "--no-progress", "--no-plot", "--no-report"]) == 0
    df = RunStore(out).read_results()
    p = json.loads(df["surrogate_params"][0])
    assert p["weight_scale"] == 0.05 and p["input_scale"] == 0.02 and p["per_step"] == 2
    assert int(df["grad_evals"][0]) == 4  # 2 steps x 2 draws
