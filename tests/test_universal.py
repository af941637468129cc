"""Universal perturbations: the ε-ball, the effect on held-out test images, the bandit's counts,
and a universal cell through the grid runner (train-split crafting, δ saved and drawn)."""
import json

import pytest
import torch
import yaml

from advtransfer.attacks import SurrogateSet, create_attack
from advtransfer.data import eval_subset, load_cifar10
from advtransfer.core.errors import UserError


@pytest.fixture(scope="module")
def craft_images():
    """Training images 0..999 (δ is crafted here, never on the test images it is judged on)."""
    return eval_subset(load_cifar10("train"), 1000)


def test_uap_stays_in_eps_ball_and_fools_its_surrogate_on_held_out_images(trained, craft_images, test_data):
    model = trained("resnet20_a")
    xc, yc, _ = craft_images
    x, y, _ = test_data
    eps = 16 / 255
    attack = create_attack("sgd_uap", eps=eps, steps=60, batch=50, n_craft=1000)
    S = SurrogateSet([model], ["resnet20_a"])
    crafted = attack.craft_delta(S, xc, yc)
    delta = crafted.delta
    assert delta.shape == (1, 3, 32, 32)
    assert float(delta.abs().max()) <= eps + 1e-6
    # sign steps of size ε/5 saturate most pixels at ±ε: δ is not a trivial zero
    assert float((delta.abs() > eps * 0.99).float().mean()) > 0.5
    # 60 updates of 50 images: every crafting image visited 3 times, one model -> 3 evaluations each
    assert crafted.grad_evals == 3
    with torch.no_grad():
        clean_err = float((model(x).argmax(1) != y).float().mean())
        adv_err = float((model((x + delta).clamp(0, 1)).argmax(1) != y).float().mean())
    # measured on test images 0..199 for ci-size resnet20_a: 0.50 -> 0.86 (and +0.13 for a weaker
    # δ of one epoch on another training run of the same recipe); a δ that did nothing (or one
    # crafted with the wrong sign) leaves the error at the clean level
    assert adv_err >= clean_err + 0.10, (clean_err, adv_err)


def test_uap_called_as_plain_attack_returns_images_in_the_ball(trained, test_data):
    x, y, _ = test_data
    x, y = x[:40], y[:40]
    eps = 8 / 255
    attack = create_attack("sgd_uap", eps=eps, steps=4, batch=20, n_craft=40)
    res = attack.run(trained("vgg_a"), x, y)
    x_adv, delta = res.x_adv, res.extras["delta"]
    d = x_adv - x
    assert float(d.abs().max()) <= eps + 1e-6 and 0 <= float(x_adv.min()) and float(x_adv.max()) <= 1
    # one δ for all images: wherever no pixel was clipped at 0 or 1 the difference is identical
    inside = ((x + delta) >= 0) & ((x + delta) <= 1)
    assert torch.allclose(d[inside], delta.expand_as(x)[inside], atol=1e-6)
    # 4 updates of 20 of the 40 images: each visited twice
    assert res.grad_evals == 2 and res.extras["info"] == {}


def test_bandit_counts_add_up_to_steps_times_k(trained, craft_images):
    xc, yc, _ = craft_images
    # a pool of three arms (the third a second handle on resnet20_a: no extra model to train)
    names = ["resnet20_a", "vgg_a", "resnet20_a_again"]
    S = SurrogateSet([trained("resnet20_a"), trained("vgg_a"), trained("resnet20_a")], names)
    attack = create_attack("xtransfer_uap", eps=8 / 255, steps=9, batch=40, n_craft=360, k=2)
    crafted = attack.craft_delta(S, xc[:360], yc[:360])
    info = crafted.info
    counts = info["bandit_counts"]
    assert set(counts) == set(names)
    assert sum(counts.values()) == 9 * 2
    # UCB plays every arm before exploiting: each was used at least once
    assert min(counts.values()) >= 1
    # 9 updates × 40 images × 2 members over 360 crafting images = 2 gradient evaluations each
    assert crafted.grad_evals == 2
    # the planned cost (dry runs, budgets) counts the same k members, not the whole pool
    assert attack.grad_evals_formula(3) == crafted.grad_evals
    assert attack.craft_passes(3, 1000) == 9 * 40 * 2
    assert info["forward_evals_total"] == 9 * 40 * 2
    # the bandit lives in the run: a second run starts from zero counts and repeats the first
    assert attack.craft_delta(S, xc[:360], yc[:360]).info == info


def test_universal_parameters_are_checked():
    with pytest.raises(UserError, match="n_craft"):
        create_attack("sgd_uap", n_craft=0)
    with pytest.raises(UserError, match="norms"):
        create_attack("xtransfer_uap", norm="l2")
    with pytest.raises(UserError, match="unknown parameter .kk."):
        create_attack("xtransfer_uap", kk=2)


def test_universal_cells_through_the_grid(tmp_path, trained):
    from advtransfer.cli import main
    from advtransfer.run.store import RunStore

    trained("resnet20_a"), trained("vgg_a")
    grid = {
        "name": "uap_test", "dataset": "cifar10", "n": 100, "size": "ci", "batch_size": 100,
        "eps": ["8/255"], "defaults": {"steps": 10},
        "attacks": {
            "xtransfer_uap": {"n_craft": 200, "batch": 50, "steps": 6, "k": 1},
            "xtransfer_uap_targeted": {"attack": "xtransfer_uap", "targeted": True, "target_class": 3,
                                       "n_craft": 200, "batch": 50, "steps": 6, "k": 1},
            "mifgsm": {},
        },
        "surrogates": [["resnet20_a", "vgg_a"]],
        "victims": ["resnet20_a", "vgg_a"],
    }
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    out = tmp_path / "run"
    assert main(["grid", str(path), "--attack", "xtransfer_uap", "--out", str(out), "--no-progress"]) == 0
    df = RunStore(out).read_results()
    # --attack NAME selects both entries running that attack, and not the others
    assert set(df["attack_label"]) == {"xtransfer_uap", "xtransfer_uap_targeted"}
    assert df["universal"].all() and (df["n_craft"] == 200).all()
    y = load_cifar10("test").y[:100]
    untargeted = df[~df["targeted"]]
    targeted = df[df["targeted"]]
    assert (untargeted["n"] == 100).all()
    assert (targeted["n"] == int((y != 3).sum())).all()  # test images of the target class are left out
    for counts in df["bandit_counts"]:
        assert sum(json.loads(counts).values()) == 6 * 1
    store = RunStore(out)
    for cell_id in df["cell_id"].unique():
        t, meta = store.load_adv(cell_id)
        assert t["delta"].shape == (1, 3, 32, 32) and float(t["delta"].abs().max()) <= 8 / 255 + 1e-6
        x = eval_subset(load_cifar10("test"), 100)[0][torch.isin(torch.arange(100), t["index"])]
        assert torch.allclose(t["x_adv"], (x + t["delta"]).clamp(0, 1), atol=1e-6)
        assert meta["fields"]["n_craft"] == 200
    figs = sorted(p.name for p in (out / "figures").glob("uap_*.png"))
    assert len(figs) == 2


def test_xtransfer_on_a_pool_of_one_is_sgd_uap(trained, craft_images):
    # grids/universal.yaml compares X-Transfer on the ensemble with X-Transfer on its ResNet-20
    # alone (claim uap_ensemble) and reads the latter as the single-surrogate UAP (claims
    # uap_ensemble and uap_vs_image): the bandit has one arm, so every update must be SGD-UAP's,
    # to the bit, at the same seed
    xc, yc, _ = craft_images
    S = SurrogateSet([trained("resnet20_a")], ["resnet20_a"])
    kw = dict(eps=8 / 255, steps=6, batch=40, n_craft=200, seed=3)
    x = create_attack("xtransfer_uap", k=2, **kw).craft_delta(S, xc[:200], yc[:200])
    s = create_attack("sgd_uap", **kw).craft_delta(S, xc[:200], yc[:200])
    assert torch.equal(x.delta, s.delta)
    assert x.grad_evals == s.grad_evals
    assert x.info["bandit_counts"] == {"resnet20_a": 6}
