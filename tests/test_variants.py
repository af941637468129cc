"""Training-data variants (DUMB's sources and balance levels, shifted domains, label sets),
fine-tuned and adapted models, downstream victims, and the mismatch / lineage / knowledge analyses.

The end-to-end tests train a tiny zoo (tinycnn, a few hundred real CIFAR-10 images each, seconds)
into the session's temporary cache through a temporary catalogue folder."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from advtransfer.data import load_cifar10, load_dataset
from advtransfer.core.errors import UserError
from advtransfer.data.variants import BALANCE_LEVELS, OUT_OF_TASK, DataVariant, apply_variant, shift_images

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def train():
    return load_cifar10("train")


def test_halves_are_disjoint_stratified_and_cover_the_split(train):
    a, b = DataVariant(source="half_a").pool(train.y), DataVariant(source="half_b").pool(train.y)
    assert not set(a) & set(b) and len(a) + len(b) == len(train)
    # each half keeps the split's class balance (CIFAR-10: 5,000 per class, 2,500 in each half)
    assert np.bincount(train.y[a], minlength=10).tolist() == [2500] * 10
    assert np.bincount(train.y[b], minlength=10).tolist() == [2500] * 10


@pytest.mark.parametrize("level", BALANCE_LEVELS)
def test_balance_levels_hold_their_shares_at_a_fixed_size(train, level):
    """DUMB keeps the training-set size fixed and moves the ground truth's balance: classes 0-4
    share the first number, 5-9 the second."""
    idx = DataVariant(source="half_a", balance=level).select(train.y, 2000)
    counts = np.bincount(train.y[idx], minlength=10)
    p, q = (int(s) / 100 for s in level.split("/"))
    assert len(idx) == 2000 and len(set(idx)) == 2000
    assert counts[:5].sum() == pytest.approx(2000 * p, abs=5) and counts[5:].sum() == pytest.approx(2000 * q, abs=5)
    assert counts[:5].max() - counts[:5].min() <= 1 and counts[5:].max() - counts[5:].min() <= 1
    assert set(idx) <= set(DataVariant(source="half_a").pool(train.y))


def test_a_balance_the_source_cannot_supply_is_refused(train):
    with pytest.raises(UserError, match="lower train_subset"):
        DataVariant(source="half_a", balance="20/80").select(train.y, 20000)


def test_label_sets_map_classes_and_leave_others_out(train):
    v = DataVariant(labels="last5")
    m = v.label_map()
    assert m[:5].eq(OUT_OF_TASK).all() and m[5:].tolist() == [0, 1, 2, 3, 4] and v.num_classes == 5
    split = apply_variant(train, DataVariant(source="half_b", labels="vehicles_animals"), 300)
    assert len(split) == 300 and set(np.unique(split.y)) <= {0, 1} and split.classes == ("vehicle", "animal")
    l5 = apply_variant(train, DataVariant(labels="last5"), 200)
    assert l5.y.min() >= 0 and l5.y.max() <= 4  # only in-task images, relabelled


def test_shifts_are_deterministic_per_image_and_change_the_images(train):
    x, idx = np.asarray(train.x[:8]), np.arange(8)
    for shift in ("colour", "noise", "blur"):
        a = shift_images(x, idx, shift)
        assert a.dtype == np.uint8 and a.shape == x.shape and np.abs(a.astype(int) - x).mean() > 2
        # the same image gets the same shift alone or in another batch (noise is seeded by its index)
        assert np.array_equal(shift_images(x[3:4], idx[3:4], shift)[0], a[3])
    ds = load_dataset("cifar10-colour", "test")
    assert np.array_equal(ds.y, load_cifar10("test").y) and not np.array_equal(ds.x[:10], load_cifar10("test").x[:10])
    with pytest.raises(UserError, match="cifar10-colour"):
        load_dataset("cifar10-fog", "test")


@pytest.mark.parametrize("data, msg", [
    ({"source": "half_c"}, "not one of all, half_a, half_b"),
    ({"balance": "10/90"}, "DUMB's levels"),
    ({"shift": "fog"}, "shift 'fog'"),
    ({"labels": "coarse"}, "label set 'coarse'"),
    ({"colour": 1}, "unknown keys"),
])
def test_bad_variants_get_one_clear_line(data, msg):
    with pytest.raises(UserError, match=msg):
        DataVariant.from_recipe({"data": data})


def test_describe_names_only_what_differs():
    assert DataVariant().describe() == "all"
    assert DataVariant(source="half_a", balance="20/80").describe() == "source=half_a;balance=20/80"


def test_label_set_sizes_the_head_and_a_contradiction_is_refused():
    from advtransfer.models.catalogue import _spec_from_entry

    entry = {"name": "x", "arch": "tinycnn", "family": "cnn",
             "recipe": {"data": {"labels": "vehicles_animals"}, "sizes": {"ci": {"epochs": 1}}}}
    assert _spec_from_entry(entry, "t.yaml").num_classes == 2
    with pytest.raises(UserError, match="num_classes 10 does not match"):
        _spec_from_entry({**entry, "num_classes": 10}, "t.yaml")


def test_information_maximisation_prefers_confident_diverse_predictions():
    from advtransfer.training.shot import information_maximisation

    confident_diverse = torch.eye(4) * 20
    collapsed = torch.zeros(4, 4)
    collapsed[:, 0] = 20
    uniform = torch.zeros(4, 4)
    # SHOT-IM: entropy per image (low when confident) minus entropy of the mean (high when diverse)
    assert information_maximisation(confident_diverse) < information_maximisation(uniform)
    assert information_maximisation(confident_diverse) < information_maximisation(collapsed)
    assert float(information_maximisation(confident_diverse)) == pytest.approx(-np.log(4), abs=1e-3)


def test_evaluation_scores_a_downstream_victim_on_its_own_labels():
    """Success = the victim's own prediction changes from correct; out-of-task images never count."""
    from advtransfer.attacks.base import Crafted
    from advtransfer.run.cell import evaluate_victim

    class Fixed(torch.nn.Module):  # predicts per image from a lookup on the first pixel
        def __init__(self, table, k):
            super().__init__()
            self.table, self.k = table, k

        def forward(self, x):
            i = (x[:, 0, 0, 0] * 10).round().long()
            return torch.nn.functional.one_hot(self.table[i], self.k).float()

    y = torch.tensor([0, 2, 5, 8, 3])          # CIFAR classes: vehicle, animal, animal, vehicle, animal
    x = torch.zeros(5, 3, 2, 2)
    x[:, 0, 0, 0] = torch.arange(5) / 10
    x_adv = x.clone()
    x_adv[:, 0, 0, 0] = (torch.arange(5) + 5) / 10
    victim = Fixed(torch.tensor([0, 1, 1, 1, 1, 1, 0, 1, 0, 1]), 2)   # clean: 0,1,1,1,1 ; adv: 1,0,1,0,1
    victim.label_map = DataVariant(labels="vehicles_animals").label_map()
    crafted = Crafted(x_adv, torch.arange(5), None, 1, 0.0)
    clean = victim(x).argmax(1)
    row, samples = evaluate_victim(victim, x, y, crafted, clean, torch.ones(5, dtype=torch.bool))
    # mapped labels 0,1,1,0,1: clean-correct images 0,1,2,4; on x_adv image 0 → 1 (fooled),
    # 1 → 0 (fooled), 2 → 1 (kept), 4 → 1 (kept)
    assert row["n_clean_correct"] == 4 and row["n_success"] == 2 and row["asr"] == 0.5
    assert row["n_task"] == 5 and samples["success"].tolist() == [True, True, False, False, False]
    victim = Fixed(torch.tensor([0, 1, 1, 1, 1, 1, 0, 1, 0, 1]), 5)
    victim.label_map = DataVariant(labels="last5").label_map()
    row, samples = evaluate_victim(victim, x, y, crafted, clean, torch.ones(5, dtype=torch.bool))
    assert row["n_task"] == 2 and samples["margin"].isna().sum() == 3  # classes 0, 2, 3 are not in last5
    with pytest.raises(UserError, match="targeted"):
        evaluate_victim(victim, x, y, Crafted(x_adv, torch.arange(5), y, 1, 0.0), clean, torch.ones(5, dtype=torch.bool))


def test_knowledge_metrics_of_a_model_with_itself():
    """α1(f→f) = 1 (the perturbation is f's own), α2 ≤ 1 always, and a model whose logits ignore
    the input shows no deviation at all."""
    from advtransfer.analysis.measures.knowledge import transfer_metrics
    from advtransfer.data import eval_subset
    from advtransfer.models.archs import ImageClassifier, build_arch

    torch.manual_seed(0)
    f = ImageClassifier(build_arch("tinycnn", num_classes=10, width=8)).eval()
    x, _, index = eval_subset(load_cifar10("test"), 16)
    m = transfer_metrics(f, f, x, index, 8 / 255, steps=3)
    assert m["alpha1"] == pytest.approx(1.0, abs=1e-6) and 0 < m["alpha2"] <= 1 + 1e-9

    class Const(torch.nn.Module):
        def forward(self, x):
            return x.flatten(1)[:, :3] * 0 + torch.tensor([1.0, 0.0, 0.0])

    g = Const()
    m2 = transfer_metrics(f, g, x, index, 8 / 255, steps=2)
    assert m2["alpha2"] == 0.0 and m2["own_change_rate"] == 0.0


# --- end to end: a tiny zoo with variants, descendants and a DUMB-like grid ------------------------

def _tiny(name, recipe, replicates=1, width=None):
    e = {"name": name, "arch": "tinycnn", "family": "cnn", "replicates": replicates,
         "recipe": {"method": "standard", "optimizer": "sgd", "lr": 0.05, "schedule": "onecycle", "batch_size": 100,
                    "augment": ["flip"], "seed": 0, **recipe}}
    if width:
        e["arch_kwargs"] = {"width": width}
    return e


@pytest.fixture(scope="module")
def tiny_zoo(tmp_path_factory):
    d = tmp_path_factory.mktemp("tinyzoo")
    ci = lambda n, e=2: {"ci": {"epochs": e, "train_subset": n}}  # noqa: E731
    models = [
        _tiny("t_src", {"data": {"source": "half_a"}, "sizes": ci(600)}, replicates=2),
        _tiny("t_ft_va", {"init_from": "t_src", "lr": 0.02, "data": {"source": "half_b", "labels": "vehicles_animals"},
                          "sizes": ci(300, 1)}, replicates=2),
        _tiny("t_lin_l5", {"init_from": "t_src", "finetune": "linear", "data": {"source": "half_b", "labels": "last5"},
                           "sizes": ci(300, 1)}),
        _tiny("t_shot", {"init_from": "t_src", "method": "shot_im", "lr": 0.01,
                         "data": {"source": "half_b", "shift": "colour"}, "sizes": ci(300, 1)}),
        _tiny("t_scratch_va", {"data": {"source": "half_b", "labels": "vehicles_animals"}, "sizes": ci(300, 1)}),
        _tiny("t_d_a", {"data": {"source": "half_a", "balance": "50/50"}, "sizes": ci(500)}, replicates=2),
        _tiny("t_d_b", {"data": {"source": "half_b", "balance": "20/80"}, "sizes": ci(500)}, replicates=2, width=16),
    ]
    (d / "tiny.yaml").write_text(yaml.safe_dump({"models": models}))
    return d


@pytest.fixture(scope="module")
def tiny_env(tiny_zoo):
    old = os.environ.get("ADVTRANSFER_ZOO")
    os.environ["ADVTRANSFER_ZOO"] = str(tiny_zoo)
    yield tiny_zoo
    if old is None:
        os.environ.pop("ADVTRANSFER_ZOO", None)
    else:
        os.environ["ADVTRANSFER_ZOO"] = old


def test_descendants_start_from_their_source_and_linear_probes_keep_the_features(tiny_env):
    from advtransfer.models import zoo

    zoo.ensure_trained(["t_lin_l5", "t_ft_va"], "ci", progress=False, log=lambda *_: None)
    src, lin, ft = (zoo.load_model(n, "ci") for n in ("t_src", "t_lin_l5", "t_ft_va"))
    s_sd, l_sd, f_sd = src.state_dict(), lin.state_dict(), ft.state_dict()
    head = [k for k in s_sd if s_sd[k].shape != l_sd[k].shape]
    assert head == list(s_sd)[-2:]  # only the classifier head (the last Linear's weight, bias) differs in shape
    # a linear probe: every backbone tensor (weights and BatchNorm statistics) is the source's
    assert all(torch.equal(s_sd[k], l_sd[k]) for k in s_sd if k not in head)
    assert any(not torch.equal(s_sd[k], f_sd[k]) for k in s_sd if k not in head)  # full fine-tuning moved them
    card = zoo.read_card("t_lin_l5", "ci")
    assert card["init_from"] == "t_src" and card["head_reinitialised"] == sorted(head)
    assert card["data"] == "source=half_b;labels=last5" and "in task" in card["clean_acc_images"]
    assert lin.label_map.tolist()[5:] == [0, 1, 2, 3, 4]


def test_lineage_dumb_and_knowledge_end_to_end(tiny_env, tmp_path, cache_dir):
    from advtransfer.analysis.measures.mismatch import dumb_table, lineage_table, relation
    from advtransfer.cli import main
    from advtransfer.models.catalogue import load_specs

    specs = load_specs()
    assert relation("t_src", "t_ft_va", specs, "ci") == "descendant"
    assert relation("t_src", "t_ft_va@r1", specs, "ci") == "other_lineage"
    assert relation("t_src", "t_src@r1", specs, "ci") == "other_lineage"
    assert relation("t_src", "t_scratch_va", specs, "ci") == "scratch"
    assert relation("t_src", "t_src", specs, "ci") == "self"

    grid = {"name": "lin", "dataset": "cifar10-colour", "craft_dataset": "cifar10", "n": 60, "size": "ci",
            "batch_size": 60, "eps": ["8/255"], "replicates": 2,
            "attacks": {"ifgsm": {"steps": 3}, "uap": {"attack": "sgd_uap", "n_craft": 200, "steps": 4}},
            "surrogates": ["t_src"],
            "victims": ["t_src", "t_ft_va", "t_ft_va@r1", "t_lin_l5", "t_shot", "t_scratch_va"]}
    path = tmp_path / "lin.yaml"
    path.write_text(yaml.safe_dump(grid))
    run = tmp_path / "run"
    assert main(["grid", str(path), "--out", str(run), "--no-progress", "--no-plot", "--no-report"]) == 0
    res = pd.read_parquet(run / "results.parquet")
    l5 = res[res["victim"] == "t_lin_l5"].iloc[0]
    n_in = int((load_cifar10("test").y[:60] >= 5).sum())
    assert l5["victim_labels"] == "last5" and l5["n_task"] == n_in
    assert l5["clean_acc"] == pytest.approx(l5["n_clean_correct"] / n_in)
    assert set(res["surrogate_data"]) == {"source=half_a"}
    assert res.set_index("victim").loc["t_shot", "victim_data"].iloc[0] == "source=half_b;shift=colour"
    # universal cells craft on the unshifted training images: the craft dataset enters their cell id
    from advtransfer.grid import expand_cells, load_grid

    spec = load_grid(str(path))
    uap = [c for c in expand_cells(spec, {m: "x" for m in spec.model_names()}) if c.attack.label == "uap"]
    assert uap and all(c.config["craft_dataset"] == "cifar10" for c in uap)

    groups, contrasts = lineage_table(run)
    rel = groups.set_index(["attack_label", "victim_recipe", "relation"])
    assert ("ifgsm", "t_ft_va", "descendant") in rel.index and ("ifgsm", "t_ft_va", "other_lineage") in rel.index
    # the pooled ASR is the rows' successes over their clean-correct images, and its interval holds it
    for (label, vr, r), g in rel.iterrows():
        assert g["asr_ci_low"] <= g["asr"] <= g["asr_ci_high"]
    own = res[(res["attack_label"] == "ifgsm") & (((res["surrogate"] == "t_src") & (res["victim"] == "t_ft_va"))
                                                  | ((res["surrogate"] == "t_src@r1") & (res["victim"] == "t_ft_va@r1")))]
    assert rel.loc[("ifgsm", "t_ft_va", "descendant"), "asr"] == pytest.approx(
        own["n_success"].sum() / own["n_clean_correct"].sum())
    assert set(contrasts["vs"]) >= {"other_lineage", "scratch"}
    c = contrasts.iloc[0]
    assert c["diff"] == pytest.approx(c["asr_descendant"] - c["asr_control"])

    # DUMB-like: two configurations differing in source, architecture (width) and balance
    grid = {"name": "dumb", "dataset": "cifar10", "n": 60, "size": "ci", "batch_size": 60, "eps": ["8/255"],
            "attacks": {"ifgsm": {"steps": 3}}, "surrogates": ["t_d_a", "t_d_b"], "victims": ["t_d_a@r1", "t_d_b@r1"]}
    path.write_text(yaml.safe_dump(grid))
    run2 = tmp_path / "run2"
    assert main(["grid", str(path), "--out", str(run2), "--no-progress", "--no-plot", "--no-report"]) == 0
    cases, costs = dumb_table(run2)
    assert len(cases) == 2 and set(map(tuple, cases[["source", "arch", "balance"]].values)) == {
        ("match",) * 3, ("mismatch",) * 3}
    res2 = pd.read_parquet(run2 / "results.parquet")
    same = res2[res2["victim"].str.split("@").str[0] == res2["surrogate"]]
    row = cases[cases["source"] == "match"].iloc[0]
    assert row["asr"] == pytest.approx(same["n_success"].sum() / same["n_clean_correct"].sum())
    assert list(costs["axis"]) == ["any"] and costs["n_surrogates"].iloc[0] == 2
    assert main(["dumb", str(run2)]) == 0 and (run2 / "dumb_cases.csv").is_file()

    # knowledge: the descendants' metrics beside their gain over the scratch twin
    out = tmp_path / "know"
    assert main(["knowledge", "t_ft_va", "t_lin_l5", "--size", "ci", "--n", "40", "--steps", "2", "--out", str(out)]) == 0
    k = pd.read_csv(out / "knowledge.csv").set_index("descendant")
    assert k.loc["t_ft_va", "scratch"] == "t_scratch_va" and np.isnan(k.loc["t_lin_l5", "gain"])
    assert k.loc["t_ft_va", "gain"] == pytest.approx(k.loc["t_ft_va", "acc_descendant"] - k.loc["t_ft_va", "acc_scratch"])
    assert ((k["alpha1"] > 0) & (k["alpha2"] > 0) & (k["alpha2"] <= 1)).all()
    assert (out / "knowledge_transfer.png").is_file()


def test_downstream_models_are_victims_only_and_never_targeted(tiny_env, tmp_path):
    from advtransfer.grid import load_grid

    base = {"name": "g", "dataset": "cifar10", "n": 10, "size": "ci", "eps": ["8/255"], "attacks": {"ifgsm": {}}}
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({**base, "surrogates": ["t_ft_va"], "victims": ["t_src"]}))
    with pytest.raises(UserError, match="use it as a victim only"):
        load_grid(str(path))
    path.write_text(yaml.safe_dump({**base, "targeted": True, "surrogates": ["t_src"], "victims": ["t_ft_va"]}))
    with pytest.raises(UserError, match="leave it out of targeted grids"):
        load_grid(str(path))


def test_knowledge_correlations_separate_the_tasks_from_the_sources():
    """Pooled over tasks, ρ picks up a task effect (one task has both the larger α1 and the larger
    gain); within each task it compares sources, where this made-up table has the opposite order."""
    from advtransfer.analysis.measures.knowledge import correlations

    df = pd.DataFrame({"labels": ["a"] * 4 + ["b"] * 4,
                       "alpha1": [0.1, 0.2, 0.3, 0.4, 0.7, 0.8, 0.9, 1.0],
                       "alpha2": [0.1, 0.2, 0.3, 0.4, 0.7, 0.8, 0.9, 1.0],
                       "own_change_rate": [0.1, 0.2, 0.3, 0.4, 0.7, 0.8, 0.9, 1.0],
                       "gain": [0.04, 0.03, 0.02, 0.01, 0.14, 0.13, 0.12, 0.11]})
    c = correlations(df, n_boot=200).set_index(["task", "measure"])
    assert c.loc[("all", "alpha1"), "rho"] > 0.3
    assert c.loc[("a", "alpha1"), "rho"] == pytest.approx(-1.0) and c.loc[("b", "alpha1"), "rho"] == pytest.approx(-1.0)
    assert c.loc[("a", "alpha1"), "n_pairs"] == 4
