"""Comparisons and the report on synthetic run folders with known per-image outcomes.

The run folders are written here (results.parquet, samples/, manifest.json) with outcomes chosen
so that the paired counts, and so the exact p-values, are known in closed form."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from advtransfer.analysis.measures.compare import compare_run, compare_runs
from advtransfer.analysis.stats import mcnemar_exact, newcombe_paired_ci
from advtransfer.cli import main

N = 200
# victim -> (n clean-correct, A only, B only, both): images 0..n_clean-1 are clean-correct; the
# first `A only` of them are fooled by A alone, the next `B only` by B alone, the next `both` by both
DESIGN = {"resnet_a": (160, 30, 10, 50), "densenet_b": (150, 5, 6, 20)}
FAMILY = {"resnet_a": "cnn", "densenet_b": "dense"}


def _outcomes(victim: str, which: str, drop: int = 0) -> tuple[np.ndarray, np.ndarray]:
    n_clean, a_only, b_only, both = DESIGN[victim]
    clean = np.arange(N) < n_clean
    k = np.arange(N)
    if which == "a":
        succ = (k < a_only) | ((k >= a_only + b_only) & (k < a_only + b_only + both))
    else:
        succ = ((k >= a_only) & (k < a_only + b_only + both))
    if which == "a":
        succ &= k >= drop  # a replicate may lose its first `drop` A-only successes
    return clean, succ & clean


def _row(label: str, attack: str, cell: str, victim: str, clean: np.ndarray, succ: np.ndarray, **kw) -> dict:
    from advtransfer.core.metrics import wilson_interval

    nc, ns = int(clean.sum()), int(succ.sum())
    lo, hi = wilson_interval(ns, nc)
    row = {
        "run_id": "synthetic", "cell_id": cell, "dataset": "cifar10", "split": "test", "n": N, "seed": 0,
        "attack": attack, "attack_label": label, "attack_params": json.dumps({"steps": 10, "norm": "linf"}),
        "norm": "linf", "eps": 8 / 255, "eps_str": "8/255", "steps": 10, "targeted": False,
        "surrogate": "ens3", "surrogate_base": "ens3", "replicate": 0, "surrogate_kind": "ensemble",
        "n_surrogates": 3, "victim": victim, "victim_family": FAMILY[victim.partition("@r")[0]], "is_whitebox": False,
        "n_clean_correct": nc, "n_adv_correct": nc - ns, "n_success": ns, "clean_acc": nc / N,
        "adv_acc": (nc - ns) / N, "asr": ns / nc, "asr_ci_low": lo, "asr_ci_high": hi,
        "linf_max": 8 / 255, "linf_mean": 8 / 255, "l2_mean": 1.2, "l2_median": 1.2,
        "grad_evals": 30, "craft_s": 12.5, "eval_s": 0.4, "device": "cpu", "zoo_size": "ci",
        "git_sha": "abc1234", "attack_version": 1, "surrogate_sha": "aa+bb+cc",
        "match": "none", "baseline_for": "",
    }
    row.update(kw)
    return row


def make_run(root: Path, replicates: int = 1, with_baseline_columns: bool = True) -> Path:
    """A run folder: attack 'cwa' and its matched baseline 'base_evals[cwa]' on surrogate 'ens3'
    (replicate r has surrogate 'ens3@r<r>'; there A loses 2r of its A-only successes)."""
    run = root
    (run / "samples").mkdir(parents=True, exist_ok=True)
    rows = []
    for r in range(replicates):
        for label, attack, which, extra in (("cwa", "cwa", "a", {}),
                                            ("base_evals[cwa]", "mifgsm", "b", {"match": "evals", "baseline_for": "cwa"})):
            cell = f"{attack}{r}{which}"
            sam = []
            for victim in DESIGN:
                clean, succ = _outcomes(victim, which, drop=2 * r)
                rows.append(_row(label, attack, cell, victim, clean, succ, replicate=r,
                                 surrogate="ens3" if r == 0 else f"ens3@r{r}", **extra))
                sam.append(pd.DataFrame({"cell_id": cell, "victim": victim, "index": np.arange(N) + 1000,
                                         "clean_correct": clean, "adv_pred": np.where(succ, 3, 1), "success": succ,
                                         "margin": np.where(succ, -1.0, 2.0), "linf": 8 / 255, "l2": 1.2}))
            pd.concat(sam).to_parquet(run / "samples" / f"{cell}.parquet", index=False)
    df = pd.DataFrame(rows)
    if not with_baseline_columns:
        df = df.drop(columns=["match", "baseline_for", "replicate", "surrogate_base"])
    df.to_parquet(run / "results.parquet", index=False)
    df.to_csv(run / "results.csv", index=False)
    manifest = {"run_id": "synthetic", "git_sha": "abc1234", "device": "cpu",
                "versions": {"torch": "2.14.1", "python": "3.11"},
                "grid": {"name": "synthetic", "dataset": "cifar10", "n": N, "size": "ci", "eps": ["8/255"],
                         "surrogates": ["ens3"], "victims": list(DESIGN)},
                "zoo": {"resnet_a": {"arch": "resnet20", "family": "cnn", "kind": "single", "clean_acc": 0.8,
                                     "train_s": 10, "sha256": "ff" * 32},
                        "densenet_b": {"arch": "densenet", "family": "dense", "kind": "single", "clean_acc": 0.75,
                                       "train_s": 12, "sha256": "ee" * 32}}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def test_matched_baseline_counts_p_and_verdict(tmp_path):
    run = make_run(tmp_path / "run")
    df = compare_run(run)
    assert len(df) == 2
    r = df.set_index("victim").loc["resnet_a"]
    assert (r["a_label"], r["b_label"], r["match"], r["surrogate"]) == ("cwa", "base_evals[cwa]", "evals", "ens3")
    assert (r["n_pairs"], r["n_a_only"], r["n_b_only"], r["n_strata"]) == (160, 30, 10, 1)
    assert r["asr_a"] == pytest.approx(80 / 160) and r["asr_b"] == pytest.approx(60 / 160)
    assert r["diff"] == pytest.approx(20 / 160)
    # exact McNemar by hand: 2 * sum_{k<=10} C(40,k) / 2^40
    p_res = 2 * sum(math.comb(40, k) for k in range(11)) / 2 ** 40
    assert r["p_mcnemar"] == pytest.approx(p_res, rel=1e-9)
    assert p_res == pytest.approx(0.00222, abs=1e-5)
    # the other victim: 5 vs 6 discordant -> 2 * sum_{k<=5} C(11,k)/2^11 = 1 (capped)
    q = df.set_index("victim").loc["densenet_b"]
    assert (q["n_pairs"], q["n_a_only"], q["n_b_only"]) == (150, 5, 6)
    assert q["p_mcnemar"] == pytest.approx(1.0)
    # Holm over the two: min(1, 2 * p_res) and max(that, 1.0)
    assert r["p_holm"] == pytest.approx(2 * p_res) and q["p_holm"] == pytest.approx(1.0)
    assert (r["verdict"], q["verdict"]) == ("a_better", "no_difference")
    assert (r["diff_ci_low"], r["diff_ci_high"]) == pytest.approx(newcombe_paired_ci(50, 30, 10, 70))
    assert r["diff_ci_low"] > 0 and r["method"] == "newcombe"


def test_replicates_are_stratified(tmp_path):
    run = make_run(tmp_path / "run", replicates=3)
    df = compare_run(run)
    assert len(df) == 2  # one comparison per victim, pooled over the 3 replicates
    r = df.set_index("victim").loc["resnet_a"]
    assert r["n_strata"] == 3
    # replicates 0, 1, 2 keep 30, 28, 26 A-only pairs and 10 B-only: per-replicate differences
    # 20/160, 18/160, 16/160 (sd 2/160); pooled b = 84, c = 30 over 480 pairs
    assert (r["n_pairs"], r["n_a_only"], r["n_b_only"]) == (480, 84, 30)
    assert r["diff"] == pytest.approx(54 / 480)
    assert r["p_mcnemar"] == pytest.approx(mcnemar_exact(84, 30))
    assert (r["diff_rep_min"], r["diff_rep_max"]) == pytest.approx((16 / 160, 20 / 160))
    assert r["diff_rep_sd"] == pytest.approx(2 / 160)
    assert len(r["a_cell_id"].split("+")) == 3


def test_bootstrap_method_and_explicit_pair(tmp_path):
    run = make_run(tmp_path / "run")
    df = compare_run(run, "base_evals[cwa]", "cwa", method="bootstrap")
    r = df.set_index("victim").loc["resnet_a"]
    assert (r["n_a_only"], r["n_b_only"], r["verdict"], r["method"]) == (10, 30, "b_better", "bootstrap")
    assert r["diff_ci_low"] < -20 / 160 < r["diff_ci_high"] < 0


def test_cli_compare_writes_tables_and_forest(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    assert main(["compare", str(run)]) == 0
    out = capsys.readouterr().out
    assert "a_better" in out and "base_evals[cwa]" in out
    for name in ("comparisons.parquet", "comparisons.csv"):
        assert (run / name).is_file()
    cols = pd.read_csv(run / "comparisons.csv").columns
    for c in ("a_label", "b_label", "a_cell_id", "b_cell_id", "surrogate", "victim", "eps", "match", "n_pairs",
              "n_a_only", "n_b_only", "asr_a", "asr_b", "diff", "diff_ci_low", "diff_ci_high", "p_mcnemar",
              "p_holm", "verdict", "method", "n_strata", "diff_rep_min", "diff_rep_max", "diff_rep_sd"):
        assert c in cols
    pngs = list((run / "figures").glob("forest_*.png"))
    assert len(pngs) == 1 and pngs[0].stat().st_size > 5000
    assert list((run / "figures").glob("forest_*.pdf"))


def test_compare_two_runs(tmp_path):
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    df = compare_runs(a, b)
    # same outcomes in both runs: 4 rows (2 labels x 2 victims), no discordant pair, p = 1
    assert len(df) == 4 and (df["n_a_only"] == 0).all() and (df["p_mcnemar"] == 1.0).all()
    assert (df["verdict"] == "no_difference").all() and (df["a_label"] == df["b_label"]).all()
    assert main(["compare", str(a), str(b), "--no-plot"]) == 0
    assert (a / "comparisons_vs_b.csv").is_file()


def test_bad_input_exits_2(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("advtransfer: error:") and err.count("\n") == 1
    old = make_run(tmp_path / "old", with_baseline_columns=False)
    assert main(["compare", str(old)]) == 2
    assert "baseline_for" in capsys.readouterr().err
    assert main(["compare", str(old), "--a", "cwa", "--b", "nope"]) == 2
    assert "'nope'" in capsys.readouterr().err
    assert main(["compare", str(old), "--a", "cwa"]) == 2
    assert main(["report", str(tmp_path / "nope")]) == 2


def test_report_md_html_tex(tmp_path):
    from advtransfer.analysis import report as rep

    run = make_run(tmp_path / "run", replicates=1)
    assert main(["report", str(run)]) == 0
    md = (run / "report" / "report.md").read_text()
    html = (run / "report" / "report.html").read_text()
    # resnet_a: +20/160 = +12.5 points, McNemar p = 0.0022 (< 0.01), Holm 2p = 0.0044
    sentence = ("cwa vs its baseline at equal gradient evaluations on resnet_a (surrogate ens3, ε 8/255): "
                "+12.5 points [")
    assert sentence in md and sentence in html
    assert "McNemar p = 0.0022, Holm 0.0044: cwa significantly stronger" in md
    # densenet_b: (5 - 6)/150 = -0.7 points, p = 1, Holm 1: no significant difference
    assert "on densenet_b (surrogate ens3, ε 8/255): \u22120.7 points [" in md
    assert "McNemar p = 1, Holm 1: no significant difference" in md
    # the verdict opens the report: over the two held-out victims cwa is better on one (resnet_a,
    # Holm 0.0044) and level on the other (densenet_b); median of +12.5 and -0.7 = +5.9
    assert md.index("## Verdict") < md.index("## Configuration") < md.index("## Comparisons")
    # one sentence per attack leads (here one attack, one matching, one surrogate row), the
    # per-surrogate table follows
    assert ("- cwa (better): better than its matched baselines on 1, worse on 0, level on 1 of 2 held-out "
            "comparisons (1 surrogate row, 2 victims, ε 8/255); median +5.9 points.") in md
    verdict = md[md.index("## Verdict"):md.index("## Configuration")]
    assert verdict.count("\n- ") == 1 and verdict.index("(better)") < verdict.index("| attack | against |")
    assert "<h2>Verdict</h2>" in html
    # the compact verdict figure: drawn with the comparisons, shown in the verdict section
    assert (run / "figures" / "verdict_comparisons.png").stat().st_size > 5000
    assert "../figures/verdict_comparisons.png" in verdict
    # long configuration values wrap instead of scrolling the page sideways
    assert '<table class="wrap">' in html
    # the report computed and wrote the comparisons it needed
    assert (run / "comparisons.parquet").is_file()
    # ASR with Wilson interval: cwa on resnet_a 80/160 -> 50.0 [42.3, 57.7]
    assert "50.0 [42.3, 57.7]" in md and "<table>" in html and "<h2>Comparisons</h2>" in html
    tex = sorted(p.name for p in (run / "report" / "tables").glob("*.tex"))
    assert {"verdict.tex", "configuration.tex", "models.tex", "comparisons.tex", "compute.tex"} <= set(tex)
    assert any(t.startswith("asr_cwa") for t in tex)
    ctex = (run / "report" / "tables" / "comparisons.tex").read_text()
    assert "\\toprule" in ctex and "base\\_evals[cwa]" in ctex

    # hook point: an optional section appears in both formats
    def extra(ctx):
        return rep.Section("Distortion", ["margins of " + str(len(ctx.results)) + " rows"])

    paths = rep.build_report(run, tmp_path / "r2", extra_sections=[extra])
    assert "## Distortion" in paths["md"].read_text() and "margins of 4 rows" in paths["html"].read_text()


def test_report_without_baselines_says_so(tmp_path):
    run = make_run(tmp_path / "old", with_baseline_columns=False)
    assert main(["report", str(run)]) == 0
    md = (run / "report" / "report.md").read_text()
    assert "No comparisons:" in md and "baseline_for" in md


def test_run_without_baselines_points_to_its_grid_reference(tmp_path):
    """A run with no matched baselines but a grid `reference:` (the surrogate-training grid): the
    one-line error names the --reference that compares its surrogates."""
    import pandas as pd
    import pytest

    from advtransfer.analysis.measures.compare import compare_run
    from advtransfer.core.errors import UserError
    from advtransfer.run.store import RunStore

    store = RunStore(tmp_path)
    rows = pd.DataFrame({"cell_id": ["c1"], "surrogate": ["resnet20_sam02"], "surrogate_base": ["resnet20_sam02"],
                         "replicate": [0], "attack_label": ["ifgsm"], "eps": [8 / 255], "seed": [0], "victim": ["vgg_b"],
                         "match": ["none"], "baseline_for": [""]})
    store.write_shard("c1", rows)
    store.merge()
    store.write_manifest({"grid": {"reference": "resnet20_std"}})
    with pytest.raises(UserError, match="--reference resnet20_std"):
        compare_run(tmp_path)


def test_paired_outcomes_join_on_the_image_and_refuse_a_duplicate():
    """The numpy join equals pandas' inner merge (A's order, images clean-correct in both), and an
    image listed twice for one victim (a damaged samples file) is one clear error, not a guess."""
    from advtransfer.analysis.measures.compare import paired_outcomes
    from advtransfer.core.errors import UserError

    rng = np.random.default_rng(1)
    a = pd.DataFrame({"index": rng.permutation(40)[:30], "clean_correct": rng.random(30) < 0.8,
                      "success": rng.random(30) < 0.5})
    b = pd.DataFrame({"index": rng.permutation(40)[:25], "clean_correct": rng.random(25) < 0.8,
                      "success": rng.random(25) < 0.5})
    m = a.merge(b, on="index", suffixes=("_a", "_b"))
    m = m[m["clean_correct_a"] & m["clean_correct_b"]]
    idx, sa, sb = paired_outcomes(a, b)
    assert 0 < len(idx) < 25
    assert list(idx) == list(m["index"]) and list(sa) == list(m["success_a"]) and list(sb) == list(m["success_b"])
    with pytest.raises(UserError, match="lists an image twice"):
        paired_outcomes(pd.concat([a, a.iloc[:1]]), b)
