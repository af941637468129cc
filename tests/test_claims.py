"""The claims table: every number recomputed from the per-image records of run folders.

The run folders are the synthetic ones of test_compare (attack 'cwa' against its evals-matched
baseline on two victims, known paired counts), written under RUNS/<size>/<grid name>/."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from advtransfer.analysis.measures.claims import claims_table, format_claims, load_claims
from advtransfer.errors import UserError
from test_compare import DESIGN, make_run

GRID = """name: synthetic
dataset: cifar10
eps: [8/255]
attacks: {cwa: {}}
surrogates: [resnet20_a]
victims: [resnet20_b]
"""


def _spec(tmp_path: Path, sizes: str = "[converged, cpu]", **claim) -> Path:
    (tmp_path / "grid.yaml").write_text(GRID)
    c = {"id": "cwa", "claim": "CWA beats the logit ensemble at equal gradient evaluations",
         "paper": "Chen et al. 2024", "setting": "CIFAR-10, 8/255", "grid": str(tmp_path / "grid.yaml"),
         "by": "attack", "a": "cwa", "b": "matched:evals", "eps": "8/255", **claim}
    body = "\n".join(f"    {k}: {v}" for k, v in c.items())
    path = tmp_path / "claims.yaml"
    path.write_text(f"name: test\nsizes: {sizes}\nclaims:\n  -\n{body}\n")
    return path


def _pooled_by_hand(replicates: int) -> tuple[int, int, int]:
    """(pairs, A-only, B-only) over both victims and every replicate of make_run's design."""
    n = a = b = 0
    for r in range(replicates):
        for n_clean, a_only, b_only, _ in DESIGN.values():
            n += n_clean
            a += max(0, a_only - 2 * r)
            b += b_only
    return n, a, b


def test_table_is_recomputed_from_the_per_image_records(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs / "converged" / "synthetic", replicates=3)
    spec = load_claims(_spec(tmp_path))
    df = claims_table(spec, runs)
    r = df.iloc[0]
    n, a_only, b_only = _pooled_by_hand(3)
    assert r["converged_n_pairs"] == n and r["converged_n_victims"] == len(DESIGN) and r["converged_n_replicates"] == 3
    # the pooled difference is the stratified one, and every stratum here has the same size per victim,
    # so it lies between the per-replicate differences, all positive (A loses 2r A-only images)
    assert r["converged_rep_min"] < r["converged_diff"] < r["converged_rep_max"]
    assert r["converged_diff"] == pytest.approx((a_only - b_only) / n, abs=0.01)
    assert r["converged_ci_low"] < r["converged_diff"] < r["converged_ci_high"]
    assert r["converged_verdict"] == "holds"
    assert r["converged_grad_evals_a"] == 30
    # the cpu zoo's run is missing: the row says how to make it, and holds no number
    assert r["cpu_verdict"] == "" and "advtransfer grid" in r["cpu_note"] and "--size cpu" in r["cpu_note"]
    text = format_claims(df, spec.sizes)
    assert "**holds**" in text and "not run" in text

    # change the records: B now fools every image A fools on every sample file -> the verdict flips
    for f in (runs / "converged" / "synthetic" / "samples").glob("cwa*.parquet"):
        s = pd.read_parquet(f)
        s["success"] = False
        s.to_parquet(f, index=False)
    r2 = claims_table(spec, runs).iloc[0]
    assert r2["converged_diff"] < 0 and r2["converged_verdict"] == "does not hold"


def test_a_claim_without_replicate_agreement_cannot_hold(tmp_path):
    """One replicate with A below B keeps "holds" away even when the pooled difference is positive."""
    runs = tmp_path / "runs"
    run = make_run(runs / "converged" / "synthetic", replicates=2)
    f = run / "samples" / "cwa1a.parquet"  # replicate 1's attack: no success at all
    s = pd.read_parquet(f)
    s["success"] = np.zeros(len(s), bool)
    s.to_parquet(f, index=False)
    r = claims_table(load_claims(_spec(tmp_path, sizes="[converged]")), runs).iloc[0]
    assert r["converged_rep_min"] < 0 < r["converged_rep_max"]
    assert r["converged_verdict"] != "holds"


@pytest.mark.parametrize("change, message", [
    ({"by": "model"}, "`by` must be attack, surrogate or victim"),
    ({"eps": "eight"}, "eps must be a fraction"),
    ({"colour": "red"}, "unknown key(s) colour"),
    ({"by": "surrogate"}, "names the attack label"),
])
def test_bad_claims_files_are_one_line(tmp_path, change, message):
    with pytest.raises(UserError) as e:
        load_claims(_spec(tmp_path, **change))
    assert message in str(e.value) and len(str(e.value).splitlines()) == 1


def test_missing_rows_are_one_line(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs / "cpu" / "synthetic")
    spec = load_claims(_spec(tmp_path, sizes="[cpu]", a="ssa"))
    with pytest.raises(UserError, match="no held-out rows of 'ssa'"):
        claims_table(spec, runs)


def test_by_victim_and_by_surrogate_read_the_same_records(tmp_path):
    runs = tmp_path / "runs"
    run = make_run(runs / "cpu" / "synthetic")
    # by victim: "densenet_b resists CWA better than resnet_a" on the images both classify correctly
    # (0..149): CWA fools 80 of them on resnet_a (0..29, 40..89) and 25 on densenet_b (0..4, 11..30)
    spec = load_claims(_spec(tmp_path, sizes="[cpu]", by="victim", a="densenet_b", b="resnet_a", attack="cwa"))
    r = claims_table(spec, runs).iloc[0]
    assert r["cpu_n_pairs"] == 150 and r["cpu_diff"] == pytest.approx((80 - 25) / 150)
    # by surrogate: the baseline's rows relabelled as attack 'cwa' of another surrogate give the
    # by-attack comparison's numbers
    by_attack = claims_table(load_claims(_spec(tmp_path, sizes="[cpu]")), runs).iloc[0]
    df = pd.read_parquet(run / "results.parquet")
    base = df["baseline_for"] == "cwa"
    df.loc[base, ["attack_label", "surrogate_base", "baseline_for", "match"]] = ["cwa", "ens_other", "", "none"]
    df.to_parquet(run / "results.parquet", index=False)
    spec = load_claims(_spec(tmp_path, sizes="[cpu]", by="surrogate", a="ens3", b="ens_other", attack="cwa"))
    r = claims_table(spec, runs).iloc[0]
    for k in ("n_pairs", "diff", "p", "ci_low", "ci_high"):
        assert r[f"cpu_{k}"] == pytest.approx(by_attack[f"cpu_{k}"]), k


def test_a_baseline_may_be_the_claimed_winner(tmp_path):
    """"MI-FGSM beats X" is the same pairs as "X beats MI-FGSM" with the sign turned."""
    runs = tmp_path / "runs"
    make_run(runs / "cpu" / "synthetic")
    fwd = claims_table(load_claims(_spec(tmp_path, sizes="[cpu]")), runs).iloc[0]
    rev = claims_table(load_claims(_spec(tmp_path, sizes="[cpu]", a="matched:evals", b="cwa")), runs).iloc[0]
    assert rev["cpu_n_pairs"] == fwd["cpu_n_pairs"] and rev["cpu_diff"] == pytest.approx(-fwd["cpu_diff"])
    assert rev["cpu_verdict"] == "does not hold" and fwd["cpu_verdict"] == "holds"


# --- the command ---------------------------------------------------------------------------------------
README_TEXT = "# Project\n\nintro\n\n{begin}\nold table\n{end}\n\nafter\n"


def test_claims_command_writes_the_table_the_report_and_the_readme(tmp_path, capsys):
    from advtransfer.analysis.cli.claims import README_BEGIN, README_END
    from advtransfer.cli import main

    runs = tmp_path / "runs"
    make_run(runs / "converged" / "synthetic", replicates=3)
    claims = _spec(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(README_TEXT.format(begin=README_BEGIN, end=README_END))
    assert main(["claims", str(claims), "--runs", str(runs), "--readme", str(readme)]) == 0
    out = capsys.readouterr().out
    assert "measured: converged 1/1, cpu 0/1" in out
    df = pd.read_parquet(runs / "claims.parquet")
    assert df.iloc[0]["converged_verdict"] == "holds"
    # the README's table is the command's table, between the markers; the rest is untouched
    text = readme.read_text()
    assert "old table" not in text and "**holds**" in text and text.startswith("# Project\n\nintro\n\n")
    assert text.endswith(f"{README_END}\n\nafter\n")
    assert format_claims(df, ("converged", "cpu")).splitlines()[2] in text
    html = (runs / "report" / "claims.html").read_text()
    assert "<strong>holds</strong>" in html and "<table class=\"wrap\">" in html
    # a second run replaces the table instead of adding one
    assert main(["claims", str(claims), "--runs", str(runs), "--readme", str(readme)]) == 0
    assert readme.read_text() == text


def test_claims_command_checks_before_writing(tmp_path, capsys):
    from advtransfer.cli import main

    runs = tmp_path / "runs"
    make_run(runs / "converged" / "synthetic", replicates=1)
    claims = _spec(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    assert main(["claims", str(claims), "--runs", str(runs), "--readme", str(readme)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no generated claims table" in err[0]
    assert readme.read_text() == "# no markers\n" and not (runs / "claims.csv").exists()
    assert main(["claims", str(tmp_path / "nope.yaml"), "--runs", str(runs)]) == 2
    assert "does not exist" in capsys.readouterr().err
    # --list-grids: what make claims-runs runs, one 'GRID NAME' line per grid
    assert main(["claims", str(claims), "--list-grids"]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "grid.yaml"), "synthetic"]
