"""Defended victims: the input-transformation wrappers and randomized smoothing on known inputs,
seeded stochastic defences, defended entries in the catalogue and the grid's tables, and the
trained defences' training steps (PGD-AT, TRADES, ensemble AT, PubDef, DVERGE)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn as nn

from advtransfer.attacks import create_attack
from advtransfer.attacks.base import CraftContext, SurrogateSet
from advtransfer.run.cell import evaluate_victim
from advtransfer.core.errors import UserError
from advtransfer.core.metrics import ABSTAIN, labels, success_counts
from advtransfer.models import zoo
from advtransfer.models.archs import ImageClassifier, build_arch
from advtransfer.models.catalogue import _spec_from_entry
from advtransfer.models.defences import (Defended, binomial_p, bit_depth, image_seeds, jpeg, median,
                                         resize_pad, resolve)


# --- wrappers on known inputs ---------------------------------------------------------------

def test_jpeg_round_trip_is_near_identity_at_high_quality_and_lossy_at_low(test_data):
    x = test_data[0][:16]
    hi, lo = jpeg(x, 100), jpeg(x, 10)
    assert hi.shape == x.shape and hi.min() >= 0 and hi.max() <= 1
    # output is 8-bit: every value a multiple of 1/255
    assert torch.allclose(hi * 255, (hi * 255).round(), atol=1e-4)
    # quality 100 keeps the image within a few levels (chroma rounding), quality 10 does not
    err_hi, err_lo = (hi - x).abs().mean(), (lo - x).abs().mean()
    assert err_hi < 2 / 255 < err_lo
    # an 8-bit image encoded twice at one quality is (nearly) a fixed point
    assert (jpeg(jpeg(x, 75), 75) - jpeg(x, 75)).abs().mean() < 1.5 / 255


def test_bit_depth_has_the_stated_levels():
    x = torch.linspace(0, 1, 3 * 32 * 32).view(1, 3, 32, 32)
    for bits in (1, 2, 4):
        out = bit_depth(x, bits)
        assert len(torch.unique(out)) == 2 ** bits
        assert (out - x).abs().max() <= 0.5 / (2 ** bits - 1) + 1e-6  # nearest level
    assert torch.equal(bit_depth(torch.tensor([0.0, 0.49, 0.51, 1.0]).view(1, 1, 2, 2), 1).flatten(),
                       torch.tensor([0.0, 0.0, 1.0, 1.0]))


def test_median_removes_an_impulse_and_keeps_a_constant():
    x = torch.full((1, 3, 8, 8), 0.3)
    spiked = x.clone()
    spiked[0, :, 4, 4] = 1.0
    assert torch.allclose(median(spiked, 3), x)
    ramp = torch.arange(8.0).view(1, 1, 1, 8).expand(1, 3, 8, 8) / 7  # monotone rows survive a median
    assert torch.allclose(median(ramp, 3)[..., 1:-1], ramp[..., 1:-1])


def test_resize_pad_is_seeded_per_image_whatever_the_batch(test_data):
    x = test_data[0][:6]
    a = resize_pad(x, 24, image_seeds(x, 0, 0))
    b = resize_pad(x[[3, 1]], 24, image_seeds(x[[3, 1]], 0, 0))
    assert a.shape == x.shape
    assert torch.equal(a[3], b[0]) and torch.equal(a[1], b[1])  # same image, same draw
    c = resize_pad(x, 24, image_seeds(x, 0, 1))
    assert not torch.equal(a, c)  # another draw differs
    # zero padding: each output has an all-zero border row or column unless drawn at full size
    assert all(float(o.abs().sum()) > 0 for o in a)


def test_binomial_p_matches_scipy():
    from scipy.stats import binomtest

    for a, b in [(10, 0), (7, 3), (30, 2), (5, 5), (20, 12)]:
        assert binomial_p(np.array([a]), np.array([b]))[0] == pytest.approx(binomtest(a, a + b, 0.5).pvalue)


class _Const(nn.Module):
    """Always class ``k`` (a confident base classifier)."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(len(x), 10)
        out[:, self.k] = 5.0
        return out


class _Coin(nn.Module):
    """Class 0 or 1 by the sign of the input's first pixel: under noise a fair coin."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(len(x), 10)
        out[:, 0] = (x[:, 0, 0, 0] > 0.5).float() * 5
        out[:, 1] = (x[:, 0, 0, 0] <= 0.5).float() * 5
        return out


def test_smoothing_votes_and_abstains_when_the_vote_is_close():
    x = torch.full((4, 3, 8, 8), 0.5)
    cfg = resolve({"kind": "smoothing", "sigma": 0.5, "n": 64, "alpha": 0.001}, "test")
    sure = Defended(_Const(3), cfg)
    scores = sure(x)
    assert torch.allclose(scores.sum(1), torch.ones(4))
    assert torch.equal(sure.decide(scores), torch.full((4,), 3))
    coin = Defended(_Coin(), cfg)  # 64 fair coin flips: a majority this close is not significant
    assert (labels(coin, x) == ABSTAIN).all()
    # an abstention on x_adv is neither correct nor a success
    y = torch.zeros(4, dtype=torch.long)
    row = success_counts(y, y.clone(), torch.full((4,), ABSTAIN), torch.ones(4, dtype=torch.bool))
    assert row["n_success"] == 0 and row["n_adv_correct"] == 0 and row["n_abstain"] == 4


def test_smoothing_is_reproducible_and_differs_between_draws(test_data):
    x = test_data[0][:3].clone()
    x[:, 0, 0, 0] = 0.5  # the coin's pixel: each noisy copy votes 0 or 1 at random
    d = Defended(_Coin(), resolve({"kind": "smoothing", "sigma": 0.25, "n": 16, "draws": 2}, "test"))
    s0 = d(x)
    assert torch.equal(s0, d(x)) and torch.equal(s0[1:], d(x[1:]))
    d.draw = 1
    assert not torch.equal(s0, d(x))


@pytest.mark.parametrize("bad, msg", [
    ({"kind": "jpg"}, "jpeg"),
    ({"kind": "jpeg", "quality": 0}, "quality"),
    ({"kind": "median", "size": 4}, "odd"),
    ({"kind": "bit_depth", "bits": 3, "draws": 2}, "deterministic"),
    ({"kind": "smoothing", "alpha": 2.0}, "alpha"),
    ({"kind": "resize_pad", "scale": 2}, "unknown keys"),
])
def test_bad_defence_entries_get_one_clear_line(bad, msg):
    with pytest.raises(UserError, match=msg) as e:
        _spec_from_entry({"name": "v", "base": "resnet20_b", "family": "defended", "defence": bad}, "victims/x.yaml")
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="base and defence only"):
        _spec_from_entry({"name": "v", "base": "resnet20_b", "family": "defended", "arch": "resnet",
                          "defence": {"kind": "jpeg"}}, "victims/x.yaml")


# --- defended entries of the ci zoo ----------------------------------------------------------

@pytest.fixture(scope="session")
def base_crafted(trained, test_data):
    """I-FGSM (8/255, 10 steps) examples of 200 test images crafted on resnet20_b itself."""
    x, y, idx = test_data
    x, y, idx = x[:200], y[:200], idx[:200]
    base = trained("resnet20_b")
    crafted = create_attack("ifgsm", eps=8 / 255, steps=10).craft(
        SurrogateSet([base], ["resnet20_b"]), CraftContext(x, y, idx, 100, "cpu"))
    return x, y, crafted


@pytest.mark.parametrize("name", ["resnet20_b_jpeg", "resnet20_b_resize"])
def test_defended_victim_is_less_fooled_than_its_base(name, trained, base_crafted):
    """Examples tuned to resnet20_b's exact input (non-adaptive: the attacker ignores the
    defence) lose part of their effect through JPEG or random resizing: at ci size 200 images
    measured about 0.94 on the base against 0.82 (JPEG q75) and 0.76 (resize-pad)."""
    x, y, crafted = base_crafted
    zoo.ensure_trained([name], "ci", progress=False, log=lambda *_: None)
    base, defended = trained("resnet20_b"), zoo.load_model(name, "ci")
    ok = torch.ones(len(y), dtype=torch.bool)
    r_base, _ = evaluate_victim(base, x, y, crafted, labels(base, x), ok)
    r_def, s_def = evaluate_victim(defended, x, y, crafted, labels(defended, x), ok)
    assert r_base["asr"] > 0.85  # white-box on the base
    assert r_def["asr"] < r_base["asr"] - 0.05
    card = zoo.read_card(name, "ci")
    assert card["kind"] == "defended" and card["base"] == "resnet20_b"
    assert card["base_sha256"] == zoo.read_card("resnet20_b", "ci")["sha256"] != card["sha256"]
    if name.endswith("resize"):  # stochastic: four draws, mean and worst reported, reproducible
        assert r_def["draws"] == 4
        assert r_def["asr_draws_mean"] <= r_def["asr_draws_worst"]
        xa = crafted.x_adv[:40]
        for d in range(4):  # each draw reproduces exactly, in any batch
            defended.draw = d
            assert torch.equal(labels(defended, xa, 40), labels(defended, xa.flip(0), 7).flip(0))
        defended.draw = 0
        assert set(np.unique(s_def["success_draws"])) <= {0, 0.25, 0.5, 0.75, 1.0}
    else:
        assert r_def["draws"] == 1 and r_def["asr_draws_mean"] == r_def["asr"]


def test_defended_entry_follows_its_base(trained, tmp_path, monkeypatch):
    """A defended card is current only while its base's weights are the ones it was carded with."""
    zoo.ensure_trained(["resnet20_b_jpeg"], "ci", progress=False, log=lambda *_: None)
    spec = zoo.get_spec("resnet20_b_jpeg")
    assert zoo.is_trained(spec, "ci")
    card = zoo.read_card("resnet20_b_jpeg", "ci")
    from advtransfer.models.cards import write_card

    write_card({**card, "base_sha256": "0" * 64})
    try:
        assert not zoo.is_trained(spec, "ci")
    finally:
        write_card(card)
    with pytest.raises(UserError, match="no weights of its own"):
        zoo.load_states("resnet20_b_jpeg", "ci")


# --- trained defences: one training step each, on tinycnn ------------------------------------

@pytest.fixture(scope="module")
def train_split():
    from advtransfer.data import load_dataset

    return load_dataset("cifar10", "train")


def _recipe(method: str, **kw) -> dict:
    return {"method": method, "optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4,
            "schedule": "onecycle", "batch_size": 64, "augment": ["flip"], "epochs": 1, "train_subset": 128,
            "seed": 0, **kw}


def test_pgd_example_stays_in_ball_and_raises_the_loss(test_data):
    from advtransfer.training.pgd_at import pgd_example

    torch.manual_seed(0)
    net = ImageClassifier(build_arch("tinycnn")).eval()
    x, y = test_data[0][:32], test_data[1][:32]
    adv = pgd_example(net, x, y, 8 / 255, 2 / 255, 5, torch.Generator().manual_seed(0))
    assert (adv - x).abs().max() <= 8 / 255 + 1e-6 and adv.min() >= 0 and adv.max() <= 1
    ce = torch.nn.functional.cross_entropy
    assert ce(net(adv), y) > ce(net(x), y)


@pytest.mark.parametrize("method, extra", [
    ("pgd_at", {"at_steps": 2}), ("trades", {"at_steps": 2}),
    ("ensemble_at", {"sources": ["src"]}), ("pubdef", {"sources": ["src"], "at_steps": 2}),
])
def test_trained_defences_train_and_change_the_weights(method, extra, train_split):
    from advtransfer.training import TrainingContext, train_from_recipe

    recipe = _recipe(method, **extra)
    ctx = TrainingContext(progress=False)
    if "sources" in extra:
        torch.manual_seed(1)
        ctx = TrainingContext(progress=False, sources={"src": ImageClassifier(build_arch("tinycnn")).eval()})
    torch.manual_seed(0)
    net = ImageClassifier(build_arch("tinycnn"))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    out = train_from_recipe(net, recipe, train_split, ctx)
    assert out.meta["steps"] == 2 and np.isfinite(out.meta["final_train_loss"])
    assert any(not torch.equal(before[k], v) for k, v in out.states[""].items())
    if method == "pubdef":  # every training image got one source's transfer example
        assert sum(out.meta["source_counts"].values()) == 128


def test_sources_without_the_zoo_get_a_clear_error(train_split):
    from advtransfer.training import TrainingContext, train_from_recipe

    with pytest.raises(UserError, match=r"the source models \[.x.\] were not loaded; train it through the zoo"):
        train_from_recipe(ImageClassifier(build_arch("tinycnn")), _recipe("pubdef", sources=["x"]), train_split,
                          TrainingContext(progress=False))


def test_dverge_distillation_moves_features_towards_the_target(test_data, train_split):
    from advtransfer.training import TrainingContext, train_from_recipe
    from advtransfer.training.dverge import distill

    torch.manual_seed(0)
    net = ImageClassifier(build_arch("ensemble", members=3, member_arch="tinycnn")).eval()
    m = net.net.subnets[0]
    layer = m[4]  # the third conv block
    x = test_data[0][:16]
    xs, xt = x[:8], x[8:]
    feats = []
    h = layer.register_forward_hook(lambda _m, _i, o: feats.append(o))

    def dist(a: torch.Tensor) -> float:
        m((a - net.mean) / net.std)
        m((xt - net.mean) / net.std)
        f_a, f_t = feats[-2], feats[-1]
        return float((f_a - f_t).pow(2).sum())

    with torch.no_grad():
        before = dist(xs)
    xd = distill(m, layer, lambda t: (t - net.mean) / net.std, xs, xt, 0.07, 0.007, 10)
    with torch.no_grad():
        after = dist(xd)
    h.remove()
    assert (xd - xs).abs().max() <= 0.07 + 1e-6
    assert after < 0.9 * before
    # and the ensemble trains with it (round-robin cross-training), recording the layers drawn
    out = train_from_recipe(net.train(), _recipe("dverge", distill_steps=2, epochs=2), train_split, TrainingContext(progress=False))
    assert out.meta["steps"] == 4 and len(out.meta["layers_used"]) == 2
    with pytest.raises(UserError, match="ensemble entry"):
        train_from_recipe(ImageClassifier(build_arch("tinycnn")), _recipe("dverge"), train_split, TrainingContext(progress=False))


def test_ensemble_net_averages_member_probabilities():
    torch.manual_seed(0)
    net = build_arch("ensemble", members=2, member_arch="tinycnn").eval()
    x = torch.rand(4, 3, 32, 32)
    p = torch.stack([torch.softmax(m(x), 1) for m in net.subnets]).mean(0)
    assert torch.allclose(net(x).exp(), p, atol=1e-6)


def test_defended_rows_in_a_grid(trained, cache_dir, tmp_path):
    """End to end: a grid with a stochastic defended victim writes draws and per-image shares."""
    import yaml

    from conftest import cli

    grid = {"name": "def", "dataset": "cifar10", "n": 30, "size": "ci", "batch_size": 30, "norm": "linf",
            "eps": ["8/255"], "defaults": {"steps": 2}, "attacks": {"ifgsm": {}}, "surrogates": ["resnet20_a"],
            "victims": ["resnet20_b", "resnet20_b_resize"]}
    path = tmp_path / "def.yaml"
    path.write_text(yaml.safe_dump(grid))
    run = tmp_path / "run"
    from advtransfer.cli import main

    assert main(["grid", str(path), "--out", str(run), "--no-progress"]) == 0
    import pandas as pd

    table = pd.read_parquet(run / "results.parquet")
    row = table.set_index("victim").loc["resnet20_b_resize"]
    assert row["draws"] == 4 and row["victim_family"] == "defended"
    assert row["asr_draws_mean"] <= row["asr_draws_worst"]
    assert table.set_index("victim").loc["resnet20_b", "draws"] == 1
    report = (run / "report" / "report.md").read_text()
    assert "Stochastic and abstaining defences" in report and "resnet20_b_resize" in report.split("worst draw")[1]
    # victims compared on the same examples, paired on images both classify correctly
    from advtransfer.analysis.measures.compare import compare_victims

    cmp = compare_victims(run, "resnet20_b")
    assert list(cmp["a_label"]) == ["resnet20_b_resize"] and (cmp["b_label"] == "resnet20_b").all()
    assert cmp["compare_by"].eq("victim").all() and 0 < int(cmp["n_pairs"].iloc[0]) <= 30
    with pytest.raises(UserError, match="victims there: resnet20_b, resnet20_b_resize"):
        compare_victims(run, "resnet20_zz")
    proc = cli("compare", str(run), "--reference-victim", "resnet20_b", "--reference", "resnet20_a", check=False)
    assert proc.returncode == 2 and "give one of them" in proc.stderr


def test_compare_victims_pools_victim_replicates_as_strata(monkeypatch):
    """Replicate k of a victim is paired with replicate k of the reference on the same cell; a
    victim without replicates is paired with the reference itself."""
    import pandas as pd

    from advtransfer.analysis.measures import compare

    n = 10
    outcome = {"d": 2, "d@r1": 3, "p": 6, "p@r1": 7, "q": 6}  # successes among the 10 images
    rows = [{"cell_id": "c1", "victim": v, "is_whitebox": False, "surrogate_base": "s", "surrogate": "s",
             "attack_label": "mifgsm", "eps": 8 / 255, "eps_str": "8/255", "norm": "linf", "targeted": False,
             "seed": 0, "replicate": 0, "match": "none", "baseline_for": "", "grad_evals": 10} for v in outcome]
    table = pd.DataFrame(rows)
    table.attrs["missing"] = []

    class FakeSamples:
        def __init__(self, _run) -> None:
            pass

        def get(self, cell_id: str, victim: str) -> pd.DataFrame:
            k = outcome[victim]
            return pd.DataFrame({"index": range(n), "clean_correct": [True] * n, "success": [i < k for i in range(n)]})

    monkeypatch.setattr(compare, "read_results", lambda _run: table.copy())
    monkeypatch.setattr(compare, "Samples", FakeSamples)
    out = compare.compare_victims("run", "p").set_index("a_label")
    assert sorted(out.index) == ["d", "q"]
    d = out.loc["d"]
    assert d["n_strata"] == 2 and d["n_pairs"] == 2 * n
    assert d["asr_a"] == pytest.approx(5 / 20) and d["asr_b"] == pytest.approx(13 / 20)
    assert d["diff_rep_min"] == pytest.approx(-0.4) and d["diff_rep_max"] == pytest.approx(-0.4)
    q = out.loc["q"]
    assert q["n_strata"] == 1 and q["asr_b"] == pytest.approx(0.6) and q["diff"] == pytest.approx(0.0)
