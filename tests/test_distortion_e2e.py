"""End to end on a tiny real run: `advtransfer grid` (three tinycnn models trained for one epoch on
1,000 CIFAR-10 images, FGSM and MI-FGSM at two ε, 40 test images) then `advtransfer distortion`.

The tiny zoo (declared in a temporary ADVTRANSFER_ZOO folder) keeps the whole test well under a
minute on one core; the ci-size resnet/vgg zoo of grids/ci.yaml takes minutes per model on a
shared CPU and would measure the same code paths."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from advtransfer.analysis.measures.distortion import search_spec
from advtransfer.cli import main
from advtransfer.run.store import RunStore

ZOO = """\
x-r: &r
  method: standard
  optimizer: sgd
  lr: 0.05
  momentum: 0.9
  weight_decay: 5.0e-4
  schedule: onecycle
  batch_size: 100
  augment: []
  sizes:
    ci: {epochs: 1, train_subset: 1000}
    cpu: {epochs: 1, train_subset: 1000}
    full: {epochs: 1, train_subset: 1000}
models:
  - {name: tiny_a, arch: tinycnn, arch_kwargs: {width: 16}, family: cnn, recipe: {<<: *r, seed: 0}}
  - {name: tiny_b, arch: tinycnn, arch_kwargs: {width: 16}, family: cnn, recipe: {<<: *r, seed: 1}}
  - {name: tiny_c, arch: tinycnn, arch_kwargs: {width: 16}, family: cnn, recipe: {<<: *r, seed: 2}}
"""

GRID = """\
name: e2e
dataset: cifar10
split: test
n: 40
size: ci
batch_size: 40
seeds: [0]
norm: linf
eps: [4/255, 8/255]
defaults: {steps: 5}
attacks:
  fgsm: {}
  mifgsm: {}
surrogates: [tiny_a, tiny_b, [tiny_a, tiny_b]]
victims: [tiny_a, tiny_b, tiny_c]
"""


DISTORTION_SECTIONS = ("Minimal distortion along the transfer direction", "ASR vs ε",
                       "Black-box yardstick (HopSkipJump)", "Exposure: worst case over transfer attacks",
                       "FiT source selection", "Model similarity (SAT)")


@pytest.mark.slow
def test_grid_then_distortion(tmp_path, monkeypatch, capsys):
    (tmp_path / "zoo").mkdir()
    (tmp_path / "zoo" / "tiny.yaml").write_text(ZOO)
    (tmp_path / "e2e.yaml").write_text(GRID)
    monkeypatch.setenv("ADVTRANSFER_ZOO", str(tmp_path / "zoo"))
    run = tmp_path / "run"
    assert main(["grid", str(tmp_path / "e2e.yaml"), "--out", str(run), "--no-plot", "--no-progress",
                 "--device", "cpu"]) == 0
    # before `advtransfer distortion`: the report has none of its sections
    assert main(["report", str(run)]) == 0
    md = (run / "report" / "report.md").read_text()
    for title in DISTORTION_SECTIONS:
        assert title not in md
    args = ["distortion", str(run), "--blackbox-budgets", "20,50", "--blackbox-n", "6", "--blackbox-norms", "l2,linf", "--fit-budgets", "5,20",
            "--device", "cpu"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "HopSkipJump" in out and "FiT" in out and "SAT" in out
    assert "scan step 1/4" in out

    # per-image minimal distortion merged into every samples table, for every row
    s = pd.concat([pd.read_parquet(p) for p in sorted((run / "samples").glob("*.parquet"))], ignore_index=True)
    assert len(s) == 12 * 3 * 40
    assert s[["min_scale", "min_linf", "min_l2", "min_exact", "queries"]].notna().all().all()
    assert set(s.min_exact) <= {0.0, 1.0} and (s.min_search == search_spec()).all()
    # t = 1 is x_adv itself, a scan point every image gets: on clean-correct images a success has
    # t* <= 1; t* <= 1 without a success means a scan point below 1 fooled and x_adv did not, so
    # the ray is not monotone and min_exact says upper bound (the former bracket tried t = 1 first
    # and bisected inside [0, 1] only for successes, so there success <=> t* <= 1 held)
    cc = s[s.clean_correct]
    assert (cc.loc[cc.success, "min_scale"] <= 1.0).all()
    assert (cc.loc[~cc.success & (cc.min_scale <= 1.0), "min_exact"] == 0).all()
    # queries: 1 for a clean-misclassified image, else 1 + the 16 scan points (step 1/4 up to 4) + bisection
    assert (s.loc[~s.clean_correct, "queries"] == 1).all()
    assert (cc.queries >= 1 + 16).all() and (cc.loc[np.isinf(cc.min_scale), "queries"] == 1 + 16).all()
    assert (s.loc[~s.clean_correct, "min_scale"] == 0).all()
    assert (s.loc[np.isfinite(s.min_scale), "min_linf"] <= 8 / 255 * 4 + 1e-6).all()
    summ = pd.read_parquet(run / "distortion.parquet")
    assert len(summ) == 36 and {"cell_id", "victim", "surrogate", "attack_label", "eps", "median_min_linf",
                                "q25_min_linf", "q75_min_linf", "median_min_l2", "q25_min_l2", "q75_min_l2",
                                "auc", "n_fooled_within_cap", "n_upper_bound", "frac_upper_bound"} <= set(summ.columns)
    assert summ["auc"].between(0, 1).all() and summ["frac_upper_bound"].between(0, 1).all()
    assert (run / "distortion.csv").is_file()
    # the console's count of exact minima and upper bounds is the summary's
    n_ub, n_f = int(summ.n_upper_bound.sum()), int(summ.n_fooled_within_cap.sum())
    assert f"minima measured: {n_f} fooled within the cap, {n_f - n_ub} exact within the tolerance, {n_ub} upper bounds" in out

    # ASR-vs-ε figures, one per (surrogate, attack), and SAT figures
    figs = {p.name for p in (run / "figures").iterdir()}
    assert {"asr_eps_tiny_a_fgsm.png", "asr_eps_tiny_a-tiny_b_mifgsm.pdf", "sat_similarity.png",
            "sat_dendrogram.png"} <= figs

    # union over attacks is at least its strongest member (white-box cells left out)
    exp = pd.read_parquet(run / "exposure.parquet")
    res = pd.read_parquet(run / "results.parquet")
    for r in exp.itertuples():
        members = res[(res.victim == r.victim) & (res.eps == r.eps) & ~res.is_whitebox]
        assert r.asr_union >= members["asr"].max() - 1e-12
        assert r.asr_union == pytest.approx(r.asr_best_member) or r.asr_union > r.asr_best_member
        assert 0 <= r.robust_acc_union <= 1
    assert set(exp.victim) == {"tiny_a", "tiny_b", "tiny_c"}

    # HopSkipJump: budgets respected exactly
    bb = pd.read_parquet(run / "blackbox.parquet")
    assert set(bb.budget) == {20, 50} and set(bb.norm) == {"l2", "linf"}
    assert len(bb) == 3 * 2 * 2 * 6
    assert (bb.queries_used <= bb.budget).all()
    started = bb[bb.clean_correct & np.isfinite(bb.min_l2) & (bb.min_l2 > 0)]
    assert len(started) and (started.queries_used == started.budget).all()
    b50 = bb[bb.budget == 50].set_index(["victim", "norm", "index"]).min_l2
    b20 = bb[bb.budget == 20].set_index(["victim", "norm", "index"]).min_l2
    assert (b50 <= b20.reindex(b50.index)).all()

    fit = pd.read_parquet(run / "fit.parquet")
    assert set(fit.Q) == {5, 20} and (fit.best_asr >= fit.random_asr - 1e-12).all()
    assert fit.fit_asr.between(0, 1).all() and (fit.queries_used == fit.Q).all()
    sim = pd.read_parquet(run / "similarity.parquet")
    assert set(zip(sim.model_a, sim.model_b)) == {("tiny_a", "tiny_b")}
    # SAT in [log ε_s, log 100]; NaN where no image is right for both and fooled by its own attack
    assert sim.sat.dropna().between(math.log(0.1) - 1e-12, math.log(100) + 1e-12).all()
    assert (sim.n_pairs > 0).any()

    # the report now carries every distortion section, with its sentences and figures
    assert main(["report", str(run)]) == 0
    md = (run / "report" / "report.md").read_text()
    html = (run / "report" / "report.html").read_text()
    for title in DISTORTION_SECTIONS:
        assert title in md and title in html
    assert "crafted at L∞ ε = 8/255: median minimal L∞ ×255 [q25, q75], surrogate × victim" in md
    assert "Upper bounds: on " in md and "clean-correct (image, cell, victim) minima" in md
    # one sentence per ASR-vs-ε figure: scaled 8/255 direction against crafting at 4/255
    assert md.count("(the craft itself)") == 6 and "scaling down the 8/255 direction gives" in md
    assert "asr_eps_tiny_a_fgsm.png" in md and "sat_dendrogram.png" in md
    # the black-box ratio, per victim, on the images HopSkipJump attacked
    for v in ("tiny_a", "tiny_b", "tiny_c"):
        assert f"- {v}: " in md
    assert "with 20 queries (transfer needs" in md or "no single transfer source" in md
    assert "FiT's pick averages" in md and "Robust accuracy against the union" in md
    assert (run / "report" / "tables" / "blackbox.tex").is_file() and (run / "report" / "tables" / "fit.tex").is_file()

    # idempotent: a second run measures nothing again and leaves the per-image tables as they were
    before = s.copy()
    assert main(args + ["--blackbox-budgets", "0", "--fit-budgets", "0", "--no-plot"]) == 0
    again = pd.concat([pd.read_parquet(p) for p in sorted((run / "samples").glob("*.parquet"))], ignore_index=True)
    pd.testing.assert_frame_equal(before, again)
    assert "minimal distortion: cell" not in capsys.readouterr().out

    # samples measured by the former search (no min_exact, no min_search) are measured again, not
    # reused: strip the two columns from one cell's table and rerun
    store = RunStore(run)
    cid = sorted(p.stem for p in (run / "samples").glob("*.parquet"))[0]
    store.replace_samples(cid, store.read_samples(cid).drop(columns=["min_exact", "min_search"]))
    assert main(args + ["--blackbox-budgets", "0", "--fit-budgets", "0", "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert out.count("minimal distortion: cell") == 3 and f"cell {cid} " in out
    again = pd.concat([pd.read_parquet(p) for p in sorted((run / "samples").glob("*.parquet"))], ignore_index=True)
    pd.testing.assert_frame_equal(before, again[before.columns])

    # a finer scan (step 1/8) is another search: every pair is measured again; its scan points
    # include every 1/4 point, so each ray the 1/4 scan saw turn back (upper bound) it sees too,
    # and its first fooled point is no later (min_scale no larger than the 1/4 scan's first fooled
    # point, which is at most one 1/4 step above that search's t̂)
    assert main(args + ["--blackbox-budgets", "0", "--fit-budgets", "0", "--no-plot", "--scan-per-unit", "8"]) == 0
    out = capsys.readouterr().out
    assert out.count("minimal distortion: cell") == 36 and "scan step 1/8" in out
    fine = pd.concat([pd.read_parquet(p) for p in sorted((run / "samples").glob("*.parquet"))], ignore_index=True)
    assert (fine.min_search == search_spec(scan_per_unit=8)).all()
    # the same per-image tables in the same order, measured again in place
    assert (fine[["victim", "index"]].to_numpy() == before[["victim", "index"]].to_numpy()).all()
    both = before[["min_exact", "min_scale"]].join(fine[["min_exact", "min_scale"]], lsuffix="_4", rsuffix="_8")
    assert (both.loc[both.min_exact_4 == 0, "min_exact_8"] == 0).all()
    fooled4 = np.isfinite(both.min_scale_4)
    assert (both.loc[fooled4, "min_scale_8"] <= both.loc[fooled4, "min_scale_4"] + 0.25 + 1e-9).all()
    ccf = fine[fine.clean_correct]
    assert (ccf.loc[np.isinf(ccf.min_scale), "queries"] == 1 + 32).all()

    # bad input: one line, exit 2
    assert main(["distortion", str(run), "--scan-per-unit", "0"]) == 2
    assert main(["distortion", str(tmp_path / "nope")]) == 2
    assert main(["distortion", str(run), "--victims", "resnet99"]) == 2
    assert main(["distortion", str(run), "--blackbox-budgets", "ten"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(e.startswith("advtransfer: error:") for e in err)
