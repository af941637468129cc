"""Surrogate-training methods (standard with kept epochs, SAM, LGV, SWAG, cSGLD) trained at ci
size on real CIFAR-10, and attacks over multi-sample surrogates (ε-ball, gradient counts)."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from advtransfer.attacks import ATTACKS, create_attack
from advtransfer.attacks.base import SurrogateSet
from advtransfer.models.collections import MemberCollection, build_collection
from advtransfer.core.errors import UserError
from advtransfer.models import zoo
from advtransfer.training.base import accuracy
from advtransfer.training.context import TrainingContext
from advtransfer.training.csgld import csgld_lr, cycle_position, sample_steps
from advtransfer.training.sam import sam_backward
from conftest import first_train_images

#: a trainer's run-time context for the tests: the CPU, no progress bar, no resume file
QUIET = TrainingContext(progress=False)


@pytest.fixture(scope="session")
def st_models(cache_dir):
    """The ci-size surrogate-training entries, trained once per session (about a minute)."""
    names = ["resnet20_std", "resnet20_sam05", "resnet20_lgv", "resnet20_swag", "resnet20_csgld"]
    zoo.ensure_trained(names, "ci", progress=False, log=lambda *_: None)
    return {n: zoo.read_card(n, "ci") for n in names}


def _flat(m: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in m.parameters()])


def test_sam_step_takes_gradient_at_perturbed_weights(test_data):
    from advtransfer.models.archs import ImageClassifier, build_arch

    x, y, _ = test_data
    x, y = x[:64], y[:64]
    torch.manual_seed(0)
    net = ImageClassifier(build_arch("tinycnn")).train()
    w0 = [p.detach().clone() for p in net.parameters()]
    bn0 = net.net[0][1].running_mean.clone()
    # plain gradient at w
    g_plain = torch.autograd.grad(F.cross_entropy(net(x), y), list(net.parameters()))
    bn_after_one = net.net[0][1].running_mean.clone()
    net.net[0][1].running_mean.copy_(bn0)
    # manual SAM gradient: at w + rho * g / ||g||
    rho = 0.5
    norm = torch.norm(torch.stack([g.norm() for g in g_plain]))
    with torch.no_grad():
        for p, g in zip(net.parameters(), g_plain):
            p.add_(rho * g / norm)
    g_manual = torch.autograd.grad(F.cross_entropy(net(x), y), list(net.parameters()))
    with torch.no_grad():
        for p, w in zip(net.parameters(), w0):
            p.copy_(w)
    net.net[0][1].running_mean.copy_(bn0)
    for p in net.parameters():
        p.grad = None
    sam_backward(rho)(net, x, y, 0.0)
    g_sam = [p.grad for p in net.parameters()]
    # weights are restored exactly, the gradient is the perturbed one, and BN moved once only
    assert all(torch.equal(p, w) for p, w in zip(net.parameters(), w0))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g_sam, g_manual))
    diff = sum(float((a - b).norm()) for a, b in zip(g_sam, g_plain))
    assert diff > 1e-3, "a radius of 0.5 must change the gradient"
    assert torch.allclose(net.net[0][1].running_mean, bn_after_one, atol=1e-6)
    # rho = 0 is plain SGD's gradient
    for p in net.parameters():
        p.grad = None
    sam_backward(0.0)(net, x, y, 0.0)
    assert all(torch.allclose(p.grad, g, atol=1e-6) for p, g in zip(net.parameters(), g_plain))
    # the fast method's summed loss (reduction="sum") takes the same step e (g/||g|| is scale-free):
    # its gradient is the batch size times the mean loss's, not one at another radius
    for p in net.parameters():
        p.grad = None
    sam_backward(rho, reduction="sum")(net, x, y, 0.0)
    assert all(torch.equal(p, w) for p, w in zip(net.parameters(), w0))
    assert all(torch.allclose(p.grad, 64 * g, rtol=1e-4, atol=1e-4) for p, g in zip(net.parameters(), g_manual))


def test_fast_method_takes_sam_steps_with_rho():
    """The converged SAM arms are the fast recipe plus ``rho``: same seed and data order, so with
    rho the weights differ from the standard arm's, rho 0 is the standard arm exactly, and the
    card's surrogate_params carry rho only when it is set (the shipped fast models' cards keep
    theirs)."""
    from advtransfer.models.archs import ImageClassifier, build_arch
    from advtransfer.training.base import train_from_recipe

    data = first_train_images(512)
    recipe = {"method": "fast", "batch_size": 128, "seed": 4, "epochs": 2, "lr": 2.0, "momentum": 0.9,
              "weight_decay": 0.005, "bias_scaler": 1.0, "label_smoothing": 0.1}
    outs = {}
    for rho in (None, 0.0, 0.1):
        torch.manual_seed(0)
        net = ImageClassifier(build_arch("tinycnn"))
        outs[rho] = train_from_recipe(net, {**recipe, **({} if rho is None else {"rho": rho})}, data, QUIET)
    plain, zero, sam = (outs[k].states[""] for k in (None, 0.0, 0.1))
    assert all(torch.equal(plain[k], zero[k]) for k in plain)
    assert any(not torch.equal(plain[k], sam[k]) for k in plain if plain[k].is_floating_point())
    assert outs[None].meta["surrogate_params"] == {"epochs": 2.0} and outs[0.1].meta["surrogate_params"]["rho"] == 0.1
    with pytest.raises(UserError, match="rho"):
        train_from_recipe(ImageClassifier(build_arch("tinycnn")), {**recipe, "rho": -0.1}, data, QUIET)


def test_sam_entry_trains_and_records_rho(st_models):
    card = st_models["resnet20_sam05"]
    assert card["kind"] == "sam" and card["surrogate_params"]["rho"] == 0.5
    std = zoo.load_model("resnet20_std", "ci")
    sam = zoo.load_model("resnet20_sam05", "ci")
    # same seed, data and schedule: only the SAM step differs, so the weights must differ
    assert not torch.allclose(_flat(std), _flat(sam))
    # large-rho SAM learns slowly (at ci size it stays near chance), but it must not diverge
    assert math.isfinite(card["meta"]["final_train_loss"]) and card["meta"]["final_train_loss"] < 3.0


def test_early_stopped_checkpoint_is_an_entry(st_models, test_data):
    base = st_models["resnet20_std"]
    assert base["epochs_kept"] == [1]
    card = zoo.read_card("resnet20_std@epoch1", "ci")
    assert card["kind"] == "es" and card["surrogate_params"]["epoch"] == 1
    # one card builder for entries and their checkpoints: both carry every common key
    common = set(zoo.make_card(zoo.get_spec("resnet20_std"), "ci", recipe=None, members=[""], clean_acc=None,
                               clean_acc_images=None, sha256="", device="cpu"))
    assert common <= set(card) and common <= set(base)
    assert card["recipe_hash"] == base["recipe_hash"] and card["checkpoint_of"] == "resnet20_std"
    early = zoo.load_model("resnet20_std@epoch1", "ci")
    final = zoo.load_model("resnet20_std", "ci")
    assert not torch.allclose(_flat(early), _flat(final))
    assert zoo.is_trained(zoo.get_spec("resnet20_std@epoch1"), "ci")
    with pytest.raises(UserError, match="keep_epochs"):
        zoo.ensure_trained(["resnet20_std@epoch7"], "ci", progress=False, log=lambda *_: None)
    with pytest.raises(UserError, match="@epoch"):
        zoo.get_spec("resnet20_std@last")


def test_lgv_snapshots_differ_and_start_from_the_trained_model(st_models):
    card = st_models["resnet20_lgv"]
    members = zoo.load_members("resnet20_lgv", "ci")
    assert len(members) == card["surrogate_params"]["K"] == 3 and card["kind"] == "lgv"
    flats = [_flat(m) for m in members]
    start = _flat(zoo.load_model("resnet20_std", "ci"))
    for i in range(3):
        for j in range(i + 1, 3):
            assert not torch.allclose(flats[i], flats[j])
    # a short constant-lr walk: snapshots stay nearer the start than the start is to a fresh init
    fresh = _flat(zoo.get_spec("resnet20_std").build())
    assert all(float((f - start).norm()) < float((fresh - start).norm()) for f in flats)
    assert min(card["clean_acc_members"].values()) > 0.12


def test_an_lgv_collection_ships_as_a_collection(st_models, cache_dir, tmp_path, monkeypatch):
    """``zoo ship`` takes a collection: its weight sets and card go to the shipped folder, the zoo
    finds them there from an empty cache, and the shipped table labels it a collection of K weight
    sets continuing its start (not a single model held to its family's line, and with no
    whole-test-set estimate: the card's accuracy is the members' mean on test images 0-999)."""
    from advtransfer.models.ship import ship, shipped_table
    from advtransfer.models.store import locate

    shipped = tmp_path / "shipped"
    monkeypatch.setenv("ADVTRANSFER_SHIPPED_ZOO", str(shipped))
    card = ship("resnet20_lgv", "ci", cache_dir)
    assert "clean_acc_test" not in card and len(card["members"]) == 3
    assert locate("resnet20_lgv", "ci", tmp_path / "empty")[0].parent == shipped / "ci"
    members = zoo.load_members("resnet20_lgv", "ci", tmp_path / "empty")
    assert len(members) == 3
    row = next(r for r in shipped_table("ci").splitlines() if r.startswith("| `resnet20_lgv`"))
    assert "none: 3 lgv weight sets from `resnet20_std`" in row and "| n/a | n/a |" in row
    ship("resnet20_csgld", "ci", cache_dir)  # a collection with no start: its samples are trained from scratch
    row = next(r for r in shipped_table("ci").splitlines() if r.startswith("| `resnet20_csgld`"))
    assert "none: 4 csgld weight sets trained from scratch, each" in row, row


@pytest.mark.parametrize("method", ["lgv", "csgld"])
def test_float16_snapshots_round_the_float32_trajectory(tmp_path, method):
    """``snapshot_dtype: float16`` (the converged collections' storage) keeps the float32 training
    trajectory and only rounds the copies: each half-precision snapshot equals the float32 run's
    snapshot rounded (so the Langevin noise and the training order are the float32 run's too), it
    is half the bytes on disk, and it loads into a float32 module that classifies like the float32
    snapshot (weights move by at most 2^-11 of themselves)."""
    from advtransfer.data import load_cifar10
    from advtransfer.models.archs import ImageClassifier, build_arch
    from advtransfer.models.store import read_states, save_states
    from advtransfer.training.csgld import train_csgld
    from advtransfer.training.lgv import train_lgv

    data = first_train_images(512)
    common = {"batch_size": 128, "seed": 3, "weight_decay": 5e-4}
    if method == "lgv":
        train, names = train_lgv, ["s00", "s01"]
        recipe = {**common, "init_from": "x", "lr": 0.05, "epochs": 1, "snapshots_per_epoch": 2, "momentum": 0.9}
    else:  # 2 cycles of one epoch, noise in the last half of each, 2 samples per cycle
        train, names = train_csgld, ["c0s0", "c0s1", "c1s0", "c1s1"]
        recipe = {**common, "lr": 0.5, "momentum": 0.0, "epochs": 2, "cycles": 2, "samples_per_cycle": 2,
                  "noise_fraction": 0.5}

    def run(**extra):
        torch.manual_seed(0)
        net = ImageClassifier(build_arch("tinycnn"))
        return train(net, {**recipe, **extra}, data, TrainingContext(name=f"{method}_test", progress=False))

    full, half = run(), run(snapshot_dtype="float16")
    assert list(full.states) == list(half.states) == names
    assert half.meta["surrogate_params"]["snapshot_dtype"] == "float16"
    assert "snapshot_dtype" not in full.meta["surrogate_params"]  # the default's card is unchanged
    for m in full.states:
        for k, v in full.states[m].items():
            h = half.states[m][k]
            if v.is_floating_point():
                assert h.dtype == torch.float16 and torch.equal(h, v.half())
            else:
                assert torch.equal(h, v)
    sha_f = save_states(tmp_path / "f.safetensors", full.states)
    sha_h = save_states(tmp_path / "h.safetensors", half.states)
    assert (tmp_path / "h.safetensors").stat().st_size < 0.6 * (tmp_path / "f.safetensors").stat().st_size
    x, _, _ = load_cifar10("test").tensors(slice(0, 256))
    for path, sha, states in (("f", sha_f, full.states), ("h", sha_h, half.states)):
        back = read_states(tmp_path / f"{path}.safetensors", sha, list(states), f"{method}_test")
        nets = []
        for m in back:
            net = ImageClassifier(build_arch("tinycnn"))
            net.load_state_dict(back[m])
            assert all(p.dtype == torch.float32 for p in net.parameters())
            nets.append(net.eval())
        if path == "f":
            ref = [n(x).argmax(1) for n in nets]
        else:  # rounding 2^-11 of each weight flips almost no prediction
            assert all(float((n(x).argmax(1) == r).float().mean()) > 0.97 for n, r in zip(nets, ref))
    with pytest.raises(UserError, match="snapshot_dtype"):
        run(snapshot_dtype="bfloat8")


def test_swag_samples_differ_from_mean_yet_classify(st_models, test_data):
    x, y, _ = test_data
    card = st_models["resnet20_swag"]
    for mode in ("diag", "lowrank"):
        coll, params = build_collection("resnet20_swag", card, {"mode": mode, "scale": 1.0, "bn_images": 256}, "ci")
        assert params["mode"] == mode
        mean_acc = accuracy(coll.mean_model, x, y)
        coll.reset()
        a = _flat(coll.draws()[0]).clone()
        acc_a = accuracy(coll.draws()[0], x, y)
        coll.advance()
        b = _flat(coll.draws()[0]).clone()
        assert not torch.allclose(a, _flat(coll.mean_model)) and not torch.allclose(a, b)
        # a sample at scale 1 is a nearby network: above chance and not far below the mean
        assert acc_a > 0.12 and acc_a > mean_acc - 0.15, (mode, acc_a, mean_acc)
        coll.reset()  # reseeding reproduces the sequence of samples
        assert torch.allclose(_flat(coll.draws()[0]), a)


def test_diagonal_only_swag_keeps_no_deviations_and_the_same_moments():
    """``max_rank: 0`` (the converged recipe; the Li et al. 2023 code stores only the mean and the
    second moment) keeps no deviation column and changes nothing else: the same run with rank 2
    stores the same mean and second moment plus its last two deviations. A low-rank draw from a
    diagonal-only posterior is refused, not faked; a diagonal draw moves away from the mean."""
    from advtransfer.models.archs import ImageClassifier, build_arch
    from advtransfer.models.collections import SWAGCollection
    from advtransfer.training.swag import train_swag

    data = first_train_images(512)
    recipe = {"init_from": "x", "lr": 0.05, "epochs": 1, "batch_size": 128,
              "collect_per_epoch": 4, "seed": 3, "momentum": 0.9, "weight_decay": 5e-4}

    def run(rank: int):
        torch.manual_seed(0)
        net = ImageClassifier(build_arch("tinycnn"))
        return train_swag(net, {**recipe, "max_rank": rank}, data, TrainingContext(name="swag_test", progress=False))

    diag, low = run(0), run(2)
    assert sorted(diag.states) == ["mean", "sqmean"] and sorted(low.states) == ["dev00", "dev01", "mean", "sqmean"]
    assert diag.meta["surrogate_params"]["rank"] == 0 and diag.meta["n_collected"] == low.meta["n_collected"] == 4
    for k in ("mean", "sqmean"):
        assert all(torch.equal(diag.states[k][n], low.states[k][n]) for n in diag.states[k])
    # E[w^2] >= E[w]^2 entry by entry (up to rounding): the variance the sampler takes the root of
    sq, mean = diag.states["sqmean"], diag.states["mean"]
    assert all(bool((sq[n] - mean[n] ** 2 >= -1e-6).all()) for n in sq)
    build = lambda: ImageClassifier(build_arch("tinycnn"))  # noqa: E731
    with pytest.raises(UserError, match="low-rank SWAG needs"):
        SWAGCollection(build, diag.states["mean"], diag.states["sqmean"], [], mode="lowrank")
    coll = SWAGCollection(build, diag.states["mean"], diag.states["sqmean"], [], mode="diag", scale=1.5)
    assert not torch.allclose(_flat(coll.draws()[0]), _flat(coll.mean_model))


def test_csgld_schedule_is_cyclical(st_models):
    total, cycles = 100, 4
    lrs = [csgld_lr(s, total, 0.5, cycles) for s in range(total)]
    assert [lrs[k * 25] for k in range(cycles)] == [0.5] * cycles  # restarts at lr_max
    for k in range(cycles):
        seg = lrs[k * 25:(k + 1) * 25]
        assert all(a > b for a, b in zip(seg, seg[1:])) and seg[-1] < 0.01
    marks = sample_steps(total, cycles, 3, 0.2)
    assert len(marks) == 12 and all(cycle_position(m - 1, total, cycles) >= 0.8 for m in marks)
    card = st_models["resnet20_csgld"]
    trace = card["meta"]["lr_trace"]
    restarts = sum(b > a for a, b in zip(trace, trace[1:]))
    assert restarts == card["surrogate_params"]["cycles"] - 1 == 1
    assert len(card["members"]) == 4 and card["kind"] == "csgld"


def _lgv_collection(per_step: int) -> MemberCollection:
    return MemberCollection(zoo.load_members("resnet20_lgv", "ci"), per_step=per_step, seed=0)


def test_shuffled_cycle_visits_every_member(st_models):
    c = _lgv_collection(1)
    seen = []
    for _ in range(6):
        c.advance()
        c.draws()
    seen = list(c.order)
    assert sorted(seen[:3]) == [0, 1, 2] and sorted(seen[3:]) == [0, 1, 2]
    c.reset()
    for _ in range(6):
        c.advance()
        c.draws()
    assert c.order == seen


def test_averaging_k_members_averages_input_gradients(st_models, test_data):
    x, y, _ = test_data
    x, y = x[:16], y[:16]
    members = zoo.load_members("resnet20_lgv", "ci")
    S = SurrogateSet(MemberCollection(members, per_step=3)).bind()
    S.advance()
    g = S.grad(x, y)
    assert S.grad_evals == 3
    singles = []
    for m in members:
        xg = x.clone().requires_grad_(True)
        (gi,) = torch.autograd.grad(F.cross_entropy(m(xg), y, reduction="sum"), xg)
        singles.append(gi)
    assert torch.allclose(g, torch.stack(singles).mean(0), atol=1e-6)
    # and that is not the gradient of the cross-entropy of the mean logits
    xg = x.clone().requires_grad_(True)
    (gm,) = torch.autograd.grad(F.cross_entropy(torch.stack([m(xg) for m in members]).mean(0), y,
                                                reduction="sum"), xg)
    assert not torch.allclose(g, gm, atol=1e-6)


@pytest.mark.parametrize("name", sorted(ATTACKS.names()) if hasattr(ATTACKS, "names") else [])
def test_every_attack_over_a_collection_keeps_ball_and_counts(name, st_models, test_data, trained):
    from advtransfer.attacks.fingerprint import SMALL

    # fewer copies/samples for the attacks that average many (their counts scale with the option)
    small = {k: v for k, v in SMALL.items() if k in ("vmifgsm", "sim", "ssa", "bsr", "admix")}

    x, y, idx = test_data
    x, y, idx = x[:8], y[:8], idx[:8]
    eps = 4 / 255
    plain = trained("resnet20_b")
    for per_step, extra in ((1, []), (2, []), (2, [plain])):
        S = SurrogateSet([_lgv_collection(per_step), *extra])
        # a universal or generative attack called on these 8 images learns on them: n_craft = batch = 8
        kind = ATTACKS.get(name).kind
        uni = {"n_craft": len(x), "batch": len(x)} if kind in ("universal", "generative") else {}
        if kind == "generative":
            uni.update(width=4, blocks=1)
        if name == "pdcl":
            uni.update(clip="tiny", prompt_steps=2)
        attack = create_attack(name, eps=eps, steps=2, **{**small.get(name, {}), **uni})
        if name == "pdcl":
            from advtransfer.attacks.fingerprint import TinyClip

            attack.clip_model = TinyClip()
        # guides fixed on one network (feature attacks, generators with a feature loss): collections are refused
        if kind == "feature" or (kind == "generative" and attack.extra["objective"] == "feature"):
            with pytest.raises(UserError, match="weight collection"):
                attack(S, x, y, idx)
            continue
        res = attack.run(S, x, y, idx)
        xa = res.x_adv
        assert float((xa - x).abs().max()) <= eps + 1e-6 and 0 <= float(xa.min()) and float(xa.max()) <= 1
        per_call = per_step + len(extra)
        assert res.grad_evals == attack.grad_evals_formula(1) * per_call, (name, per_step, len(extra))


def test_grid_rows_record_training_method(st_models, tmp_path, cache_dir):
    import pandas as pd
    import yaml

    from advtransfer.grid import load_grid
    from advtransfer.run.context import RunContext
    from advtransfer.run.runner import run_grid

    grid = {"name": "st", "n": 10, "size": "ci", "batch_size": 10, "eps": ["8/255"], "defaults": {"steps": 2},
            "attacks": {"ifgsm": {}},
            "surrogates": ["resnet20_std@epoch1", "resnet20_sam05", "resnet20_csgld",
                           {"models": ["resnet20_lgv"], "name": "lgv_k2", "per_step": 2},
                           {"models": ["resnet20_swag"], "name": "swag_lr", "mode": "lowrank", "scale": 1.5}],
            "victims": ["resnet20_std"]}
    path = tmp_path / "st.yaml"
    path.write_text(yaml.safe_dump(grid))
    run = run_grid(load_grid(str(path)), RunContext(tmp_path / "run", progress=False), log=lambda *_: None)
    df = pd.read_parquet(run / "results.parquet").set_index("surrogate")
    assert df.loc["resnet20_std@epoch1", "surrogate_kind"] == "es"
    assert json.loads(df.loc["resnet20_sam05", "surrogate_params"])["rho"] == 0.5
    assert df.loc["resnet20_csgld", "surrogate_kind"] == "csgld"
    assert df.loc["lgv_k2", "grad_evals"] == 4 and json.loads(df.loc["lgv_k2", "surrogate_params"])["per_step"] == 2
    assert df.loc["resnet20_csgld", "grad_evals"] == 2
    p = json.loads(df.loc["swag_lr", "surrogate_params"])
    assert df.loc["swag_lr", "surrogate_kind"] == "swag" and p["mode"] == "lowrank" and p["scale"] == 1.5
    assert (df["linf_max"] <= 8 / 255 + 1e-6).all()
    bad = dict(grid, surrogates=[{"models": ["resnet20_std"], "per_step": 2}])
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(UserError, match="collection"):
        run_grid(load_grid(str(path)), RunContext(tmp_path / "run2", progress=False), log=lambda *_: None)
