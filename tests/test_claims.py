"""The claims table: every number recomputed from the per-image records of run folders.

The run folders are the synthetic ones of test_compare (attack 'cwa' against its evals-matched
baseline on two victims, known paired counts), written under RUNS/<size>/<grid name>/."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from advtransfer.analysis.measures.claims import claims_table, format_claims, load_claims
from advtransfer.core.errors import UserError
from test_compare import DESIGN, N, make_run

GRID = """name: synthetic
dataset: cifar10
eps: [8/255]
attacks: {cwa: {}}
surrogates: [resnet20_a]
victims: [resnet20_b]
"""


def _spec(tmp_path: Path, sizes: str = "[converged, cpu]", claim_sizes: dict | None = None, **claim) -> Path:
    """A claims file of one claim (the file's ``sizes``; the claim's own ``sizes:`` is ``claim_sizes``)."""
    (tmp_path / "grid.yaml").write_text(GRID)
    c = {"id": "cwa", "claim": "CWA beats the logit ensemble at equal gradient evaluations",
         "paper": "Chen et al. 2024", "setting": "CIFAR-10, 8/255", "grid": str(tmp_path / "grid.yaml"),
         "by": "attack", "a": "cwa", "b": "matched:evals", "eps": "8/255", **claim}
    if claim_sizes is not None:
        c["sizes"] = claim_sizes
    c = {k: v for k, v in c.items() if v is not None}  # b=None: a claim without `b`
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
    # an exact p that underflows to 0 is printed as a bound, never as "0"
    assert "p_Holm < 1e-300" in format_claims(df.assign(converged_p_holm=0.0), spec.sizes)

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
    ({"by": "model"}, "`by` must be attack, surrogate, victim, lineage or whitebox"),
    ({"by": "lineage", "attack": "cwa"}, "leave `b` out"),
    ({"by": "lineage", "b": None}, "names the attack label"),
    ({"by": "whitebox"}, "names the grid of its baseline's ladder"),
    ({"ladder": "repr-vs-data"}, "belongs to a `by: whitebox` claim only"),
    ({"by": "whitebox", "ladder": "lad", "a": "ladder:mifgsm", "b": "ladder:pgd"}, "one side is the ladder's baseline"),
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
    df = claims_table(spec, runs)
    r = df.iloc[0]
    assert r["cpu_n_pairs"] == 150 and r["cpu_diff"] == pytest.approx((80 - 25) / 150)
    # each side's ASR is its own victim's (A = densenet_b, the resisting one, lower), and its clean
    # accuracy on the run's 200 images is the cost column (densenet_b 150, resnet_a 160 correct)
    assert (r["cpu_asr_a"], r["cpu_asr_b"]) == pytest.approx((25 / 150, 80 / 150))
    assert r["cpu_diff"] == pytest.approx(r["cpu_asr_b"] - r["cpu_asr_a"])
    assert (r["cpu_clean_a"], r["cpu_clean_b"]) == pytest.approx((150 / 200, 160 / 200)) and r["cpu_n_sources"] == 1
    text = format_claims(df, spec.sizes)
    assert "ASR on A 16.7% vs on B 53.3% from 1 source; clean accuracy A 75.0% vs B 80.0%" in text
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


def test_by_lineage_pairs_each_surrogate_replicate_with_its_own_descendant(tmp_path):
    """AdaptGuard's question: replicate r's examples on its own descendant ``desc@r<r>`` against the
    same recipe descended from the other source replicate. make_run's victims are renamed so that
    replicate r's resnet_a outcomes are its own descendant's and its densenet_b outcomes the other
    lineage's: the claim must pair exactly those, image by image, never r's own with r's own."""
    from test_compare import _outcomes

    runs = tmp_path / "runs"
    run = make_run(runs / "cpu" / "synthetic", replicates=2)
    name = lambda r: "desc" if r == 0 else f"desc@r{r}"  # noqa: E731
    rename = {r: {"resnet_a": name(r), "densenet_b": name(1 - r)} for r in (0, 1)}
    df = pd.read_parquet(run / "results.parquet")
    df["victim"] = [rename[int(r)][v] for r, v in zip(df["replicate"], df["victim"])]
    df.to_parquet(run / "results.parquet", index=False)
    for r in (0, 1):
        for cell in (f"cwa{r}a", f"mifgsm{r}b"):
            f = run / "samples" / f"{cell}.parquet"
            s = pd.read_parquet(f)
            s["victim"] = s["victim"].map(rename[r])
            s.to_parquet(f, index=False)
    spec = load_claims(_spec(tmp_path, sizes="[cpu]", by="lineage", a="desc", b=None, attack="cwa"))
    r = claims_table(spec, runs).iloc[0]
    own_fooled = other_fooled = pairs = 0
    per_rep = []
    for rep in (0, 1):
        c_own, s_own = _outcomes("resnet_a", "a", drop=2 * rep)
        c_oth, s_oth = _outcomes("densenet_b", "a", drop=2 * rep)
        both = c_own & c_oth
        own_fooled += int((s_own & both).sum())
        other_fooled += int((s_oth & both).sum())
        pairs += int(both.sum())
        per_rep.append(((s_own & both).sum() - (s_oth & both).sum()) / both.sum())
    assert r["cpu_n_pairs"] == pairs and r["cpu_n_replicates"] == 2
    assert (r["cpu_asr_a"], r["cpu_asr_b"]) == pytest.approx((own_fooled / pairs, other_fooled / pairs))
    assert r["cpu_diff"] == pytest.approx((own_fooled - other_fooled) / pairs)
    assert (r["cpu_rep_min"], r["cpu_rep_max"]) == pytest.approx((min(per_rep), max(per_rep)))
    assert r["cpu_verdict"] == "holds"  # 80 vs 25 of 150 in replicate 0: far past any noise
    assert spec.claims[0].b == "desc (other lineages)"
    # with catalogue models the name rule is checked against the catalogue's init_from chain:
    # src_resnet@r<k>'s fine-tuned descendant is src_resnet_ft_colour@r<k> (victims/adaptation.yaml)
    df = pd.read_parquet(run / "results.parquet")
    real = df.assign(surrogate=df["surrogate"].str.replace("ens3", "src_resnet"),
                     victim=df["victim"].str.replace("desc", "src_resnet_ft_colour"))
    real.to_parquet(run / "results.parquet", index=False)
    for r in (0, 1):
        for cell in (f"cwa{r}a", f"mifgsm{r}b"):
            f = run / "samples" / f"{cell}.parquet"
            smp = pd.read_parquet(f)
            smp["victim"] = smp["victim"].str.replace("desc", "src_resnet_ft_colour")
            smp.to_parquet(f, index=False)
    spec = load_claims(_spec(tmp_path, sizes="[cpu]", by="lineage", a="src_resnet_ft_colour", b=None, attack="cwa"))
    assert claims_table(spec, runs).iloc[0]["cpu_diff"] == pytest.approx((own_fooled - other_fooled) / pairs)
    # a run whose replicate names cross the lineages (source r0 beside descendant @r1) is refused
    swap = {"src_resnet": "src_resnet@r1", "src_resnet@r1": "src_resnet"}
    real.assign(surrogate=real["surrogate"].map(swap)).to_parquet(run / "results.parquet", index=False)
    with pytest.raises(UserError, match="does not continue from surrogate"):
        claims_table(spec, runs)


def test_a_baseline_may_be_the_claimed_winner(tmp_path):
    """"MI-FGSM beats X" is the same pairs as "X beats MI-FGSM" with the sign turned."""
    runs = tmp_path / "runs"
    make_run(runs / "cpu" / "synthetic")
    fwd = claims_table(load_claims(_spec(tmp_path, sizes="[cpu]")), runs).iloc[0]
    rev = claims_table(load_claims(_spec(tmp_path, sizes="[cpu]", a="matched:evals", b="cwa")), runs).iloc[0]
    assert rev["cpu_n_pairs"] == fwd["cpu_n_pairs"] and rev["cpu_diff"] == pytest.approx(-fwd["cpu_diff"])
    assert rev["cpu_verdict"] == "does not hold" and fwd["cpu_verdict"] == "holds"


# --- the command ---------------------------------------------------------------------------------------
PAGE_TEXT = "# Claims\n\nintro\n\n{begin}\nold table\n{end}\n\nafter\n"


def test_claims_command_writes_the_table_the_report_and_the_page(tmp_path, capsys):
    from advtransfer.cli.claims import README_BEGIN, README_END
    from advtransfer.cli import main

    runs = tmp_path / "runs"
    make_run(runs / "converged" / "synthetic", replicates=3)
    claims = _spec(tmp_path)
    page = tmp_path / "claims.md"  # docs/claims.md in the project
    page.write_text(PAGE_TEXT.format(begin=README_BEGIN, end=README_END))
    assert main(["claims", str(claims), "--runs", str(runs), "--page", str(page)]) == 0
    out = capsys.readouterr().out
    assert "measured: converged 1/1, cpu 0/1" in out
    df = pd.read_parquet(runs / "claims.parquet")
    assert df.iloc[0]["converged_verdict"] == "holds"
    # the page's table is the command's table, between the markers; the rest is untouched
    text = page.read_text()
    assert "old table" not in text and "**holds**" in text and text.startswith("# Claims\n\nintro\n\n")
    assert text.endswith(f"{README_END}\n\nafter\n")
    assert format_claims(df, ("converged", "cpu")).splitlines()[2] in text
    html = (runs / "report" / "claims.html").read_text()
    assert "<strong>holds</strong>" in html and "<table class=\"wrap\">" in html
    assert "*" not in html.split("<tbody>", 1)[1].split("</tbody>", 1)[0]  # no Markdown asterisks left in cells
    # a second run replaces the table instead of adding one (--readme: the flag's former name)
    assert main(["claims", str(claims), "--runs", str(runs), "--readme", str(page)]) == 0
    assert page.read_text() == text


def test_the_html_table_keeps_bold_verdicts_and_italic_labels():
    from advtransfer.cli.claims import _md_to_html

    md = "| claim | converged |\n|---|---|\n| x*y | *regime-dependent: holds in a; not in b*. **holds**: +2 |"
    html = _md_to_html(md)
    assert "<em>regime-dependent: holds in a; not in b</em>" in html and "<strong>holds</strong>" in html
    assert "x*y" in html  # a lone asterisk is text


def test_claims_command_checks_before_writing(tmp_path, capsys):
    from advtransfer.cli import main

    runs = tmp_path / "runs"
    make_run(runs / "converged" / "synthetic", replicates=1)
    claims = _spec(tmp_path)
    page = tmp_path / "claims.md"
    page.write_text("# no markers\n")
    assert main(["claims", str(claims), "--runs", str(runs), "--page", str(page)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no generated claims table" in err[0]
    assert page.read_text() == "# no markers\n" and not (runs / "claims.csv").exists()
    assert main(["claims", str(tmp_path / "nope.yaml"), "--runs", str(runs)]) == 2
    assert "does not exist" in capsys.readouterr().err
    # --list-grids: what make claims-runs runs, one 'FOLDER<tab>GRID ARGS' line per run
    assert main(["claims", str(claims), "--list-grids"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"synthetic\t{tmp_path / 'grid.yaml'}"]


# --- the committed records -----------------------------------------------------------------------------
def _finish(run: Path, extra_cell: bool = True) -> None:
    """Mark a synthetic run finished (as `advtransfer grid` does) and add a cell no claim pairs."""
    import json

    if extra_cell:  # an attack no claim names: its rows and samples must stay out of the records
        df = pd.read_parquet(run / "results.parquet")
        other = df[df["cell_id"] == "cwa0a"].assign(cell_id="pgd0x", attack_label="pgd", attack="pgd")
        pd.concat([df, other]).to_parquet(run / "results.parquet", index=False)
        s = pd.read_parquet(run / "samples" / "cwa0a.parquet").assign(cell_id="pgd0x")
        s.to_parquet(run / "samples" / "pgd0x.parquet", index=False)
    m = json.loads((run / "manifest.json").read_text())
    m["finished_at"] = "2026-12-04T00:00:00+00:00"
    m["grid_file"] = str(run.parent / "g.yaml")  # an absolute path, outside the checkout
    (run / "manifest.json").write_text(json.dumps(m))


def test_records_hold_what_the_table_needs_and_give_the_same_table(tmp_path):
    """The exported records are a fraction of the run, yet every number of the table is the run's."""
    import json

    from advtransfer.analysis.measures.claim_records import RECORD_COLUMNS, export_records

    runs, records = tmp_path / "runs", tmp_path / "records"
    run = make_run(runs / "converged" / "synthetic", replicates=2)
    _finish(run)
    spec = load_claims(_spec(tmp_path))
    done = export_records(spec, runs, records, log=lambda m: None)
    assert [(e.size, e.grid, e.cells, e.rows) for e in done] == [("converged", "synthetic", 4, 8)]
    rec = records / "converged" / "synthetic"
    assert sorted(f.stem for f in (rec / "samples").glob("*.parquet")) == ["cwa0a", "cwa1a", "mifgsm0b", "mifgsm1b"]
    s = pd.read_parquet(rec / "samples" / "cwa1a.parquet")
    assert tuple(s.columns) == RECORD_COLUMNS  # no predictions, margins or norms
    assert set(pd.read_parquet(rec / "results.parquet")["cell_id"]) == {"cwa0a", "cwa1a", "mifgsm0b", "mifgsm1b"}
    source = json.loads((rec / "source.json").read_text())
    assert source["git_sha"] == "abc1234"
    assert (source["run"], source["grid_file"]) == ("synthetic", "g.yaml")  # records name no machine's folders
    pd.testing.assert_frame_equal(claims_table(spec, records), claims_table(spec, runs))
    # a changed record changes the table: the table is read from the records, not kept anywhere else
    s["success"] = False
    s.to_parquet(rec / "samples" / "cwa1a.parquet", index=False)
    assert claims_table(spec, records).iloc[0]["converged_diff"] < claims_table(spec, runs).iloc[0]["converged_diff"]


def test_an_unfinished_run_leaves_the_records_as_they_were(tmp_path):
    import json

    from advtransfer.analysis.measures.claim_records import export_records

    runs, records = tmp_path / "runs", tmp_path / "records"
    run = make_run(runs / "cpu" / "synthetic")
    _finish(run, extra_cell=False)
    spec = load_claims(_spec(tmp_path, sizes="[cpu]"))
    export_records(spec, runs, records, log=lambda m: None)
    before = {f: f.read_bytes() for f in (records / "cpu").rglob("*") if f.is_file()}
    m = json.loads((run / "manifest.json").read_text())
    m["finished_at"] = None  # a rerun was interrupted
    (run / "manifest.json").write_text(json.dumps(m))
    (run / "samples" / "cwa0a.parquet").unlink()
    said: list[str] = []
    assert export_records(spec, runs, records, log=said.append) == []
    assert len(said) == 1 and "did not finish" in said[0]
    assert {f: f.read_bytes() for f in (records / "cpu").rglob("*") if f.is_file()} == before


def test_claims_command_tabulates_from_the_records(tmp_path, capsys):
    from advtransfer.cli import main

    runs, records = tmp_path / "runs", tmp_path / "records"
    _finish(make_run(runs / "converged" / "synthetic", replicates=3))
    claims = _spec(tmp_path)
    assert main(["claims", str(claims), "--runs", str(runs), "--records", str(records),
                 "--out", str(tmp_path / "out")]) == 0
    assert "records: " in capsys.readouterr().out
    import shutil

    shutil.rmtree(runs)  # a fresh clone has the records only
    assert main(["claims", str(claims), "--runs", str(runs), "--records", str(records),
                 "--out", str(tmp_path / "out2")]) == 0
    a, b = (pd.read_parquet(tmp_path / d / "claims.parquet") for d in ("out", "out2"))
    assert a.iloc[0]["converged_verdict"] == "holds"
    pd.testing.assert_frame_equal(a, b)


def test_the_docs_claims_table_is_the_committed_records_table():
    """No number in the claims table of docs/claims.md is typed: it is what claims/records gives today
    (`make claims` writes it there)."""
    from advtransfer.cli.claims import README_BEGIN, README_END

    root = Path(__file__).resolve().parents[1]
    spec = load_claims(root / "claims" / "cifar10.yaml")
    table = format_claims(claims_table(spec, root / "claims" / "records"), spec.sizes)
    text = (root / "docs" / "claims.md").read_text()
    generated = text.split(README_BEGIN + "\n", 1)[1].split(README_END, 1)[0]
    assert generated.rstrip("\n") == table.rstrip("\n")


def test_a_claim_may_differ_per_size(tmp_path, capsys):
    """A size that trains differently names its own grid (and models) for the same claim."""
    from advtransfer.cli import main

    (tmp_path / "grid2.yaml").write_text(GRID.replace("name: synthetic", "name: synthetic2"))
    runs = tmp_path / "runs"
    make_run(runs / "converged" / "synthetic", replicates=2)
    make_run(runs / "cpu" / "synthetic2", replicates=1)
    path = _spec(tmp_path, claim_sizes={"cpu": {"grid": str(tmp_path / "grid2.yaml")}})
    spec = load_claims(path)
    assert spec.grid_names("cpu") == [str(tmp_path / "grid2.yaml")] and len(spec.grid_names()) == 2
    r = claims_table(spec, runs).iloc[0]
    assert r["converged_n_replicates"] == 2 and r["cpu_n_replicates"] == 1
    assert main(["claims", str(path), "--list-grids", "--size", "cpu"]) == 0
    assert capsys.readouterr().out.split() == ["synthetic2", str(tmp_path / "grid2.yaml")]
    for sizes, message in [({"full": {"a": "x"}}, "not one of the file's sizes"),
                           ({"cpu": {"eps": "4/255"}}, "may only set grid, a, b"),
                           ({"cpu": "grid2"}, "sizes must map a zoo size")]:
        with pytest.raises(UserError, match=re.escape(message)):
            load_claims(_spec(tmp_path, claim_sizes=sizes))
    assert main(["claims", str(path), "--list-grids", "--size", "full"]) == 2
    # a size where the claim is not measured says why, and its grid is not listed for that size
    skip = load_claims(_spec(tmp_path, claim_sizes={"cpu": {"skip": "too costly on 2 cores"}}))
    assert skip.grid_names("cpu") == []
    r = claims_table(skip, runs).iloc[0]
    assert r["cpu_note"] == "not measured: too costly on 2 cores" and r["cpu_verdict"] == ""
    assert "not measured: too costly on 2 cores" in format_claims(claims_table(skip, runs), skip.sizes)


# --- at equal white-box success ---------------------------------------------------------------------------
LADDER = {2: (0.3, 0.2), 4: (0.6, 0.4), 8: (0.9, 0.7)}  # eps*255 -> (white-box ASR, transfer ASR) of MI-FGSM


def _wb_runs(runs: Path, size: str, second_whitebox: float | None = None, replicate_transfer: float | None = None) -> None:
    """An attack run (repr_push on surrogate resnet_a: white-box 60%, transfer 10% on densenet_b)
    and a ladder run (MI-FGSM at 2, 4, 8/255 on the same surrogate, images and victims, LADDER's
    rates), all images clean-correct; every success set is the first k images, so the attack's
    white-box level is the ladder's 4/255 point in every bootstrap resample. ``second_whitebox``
    adds surrogate densenet_b (victim resnet_a) with that white-box level and the same ladder.
    ``replicate_transfer`` adds replicate resnet_a@r1 (white-box 60%, that transfer on densenet_b)
    whose victims also hold its sibling resnet_a, fooled on 90% (same recipe, another seed: not
    held out), and gives resnet_a the victim resnet_a@r1 the same way."""
    import json

    from test_compare import N, _row

    def first(frac: float) -> np.ndarray:
        return np.arange(N) < round(frac * N)

    clean = np.ones(N, bool)
    pairs = [("resnet_a", "densenet_b")] + ([("densenet_b", "resnet_a")] if second_whitebox is not None else [])
    pairs += [("resnet_a@r1", "densenet_b")] if replicate_transfer is not None else []
    for name in ("synthetic", "ladder"):
        run = runs / size / name
        (run / "samples").mkdir(parents=True)
        rows = []
        for sur, held_out in pairs:
            if name == "synthetic":
                tr = replicate_transfer if sur.endswith("@r1") else 0.1
                cells = {("repr_push", 8): (0.6 if sur.startswith("resnet_a") else second_whitebox, tr)}
            else:
                cells = {("mifgsm", e): v for e, v in LADDER.items()}
            for (attack, e), (wb, tr) in cells.items():
                cell = f"{attack}{e}{sur}"
                sam = []
                victims = [(sur, first(wb)), (held_out, first(tr))]
                if replicate_transfer is not None and sur.startswith("resnet_a"):
                    victims.append(("resnet_a" if sur.endswith("@r1") else "resnet_a@r1", first(0.9)))
                for victim, succ in victims:
                    rows.append(_row(attack, attack, cell, victim, clean, succ, surrogate=sur,
                                     surrogate_base=sur.partition("@r")[0], replicate=1 if sur.endswith("@r1") else 0,
                                     n_surrogates=1, is_whitebox=victim == sur,
                                     eps=e / 255, eps_str=f"{e}/255", grad_evals=10, surrogate_kind="single"))
                    sam.append(pd.DataFrame({"cell_id": cell, "victim": victim, "index": np.arange(N),
                                             "clean_correct": clean, "adv_pred": np.where(succ, 3, 1), "success": succ,
                                             "margin": 0.0, "linf": e / 255, "l2": 1.0}))
                pd.concat(sam).to_parquet(run / "samples" / f"{cell}.parquet", index=False)
        pd.DataFrame(rows).to_parquet(run / "results.parquet", index=False)
        (run / "manifest.json").write_text(json.dumps({"run_id": name, "git_sha": "abc1234", "zoo": {},
                                                        "finished_at": "2026-12-04T00:00:00+00:00"}))


def test_a_whitebox_claim_reads_the_baseline_off_its_ladder(tmp_path):
    """repr_push reaches 60% white-box, which MI-FGSM's ladder reaches at 4/255, where it transfers
    40%: "data-space beats representation-space at equal white-box success" is +30 points, and
    stays so in every resample (nested success sets), so it holds; at equal eps (8/255, 70%) it
    would read +60. The records keep the white-box rows and the whole ladder, and give the same table."""
    from advtransfer.analysis.measures.claim_records import export_records

    (tmp_path / "ladder.yaml").write_text(GRID.replace("name: synthetic", "name: ladder"))
    runs, records = tmp_path / "runs", tmp_path / "records"
    _wb_runs(runs, "cpu")
    spec = load_claims(_spec(tmp_path, sizes="[cpu]", by="whitebox", ladder=str(tmp_path / "ladder.yaml"),
                             a="ladder:mifgsm", b="repr_push"))
    assert spec.grid_names("cpu") == [str(tmp_path / "grid.yaml"), str(tmp_path / "ladder.yaml")]
    r = claims_table(spec, runs).iloc[0]
    assert r["cpu_diff"] == pytest.approx(0.3) and (r["cpu_asr_a"], r["cpu_asr_b"]) == pytest.approx((0.4, 0.1))
    assert r["cpu_eps_matched"] == pytest.approx(4 / 255) and r["cpu_whitebox_attack"] == pytest.approx(0.6)
    assert r["cpu_ci_low"] > 0.2 and r["cpu_ci_high"] < 0.4 and r["cpu_p"] == pytest.approx(1 / 2000)
    assert r["cpu_verdict"] == "holds" and r["cpu_n_victims"] == 1
    text = format_claims(claims_table(spec, runs), spec.sizes)
    assert "A read off its ladder at B's white-box ASR 60.0%" in text and "matched eps 4.0/255" in text
    # the sides turned: the same pairs, the sign turned
    rev = claims_table(load_claims(_spec(tmp_path, sizes="[cpu]", by="whitebox", ladder=str(tmp_path / "ladder.yaml"),
                                         a="repr_push", b="ladder:mifgsm")), runs).iloc[0]
    assert rev["cpu_diff"] == pytest.approx(-0.3) and rev["cpu_verdict"] == "does not hold"
    assert (rev["cpu_asr_a"], rev["cpu_asr_b"]) == pytest.approx((0.1, 0.4))
    # a claim at an eps the attack's run does not have: one line saying so
    with pytest.raises(UserError, match=r"no single-model rows of attack repr_push at eps 4/255"):
        claims_table(load_claims(_spec(tmp_path, sizes="[cpu]", by="whitebox", ladder=str(tmp_path / "ladder.yaml"),
                                       a="ladder:mifgsm", b="repr_push", eps="4/255")), runs)
    done = export_records(spec, runs, records, log=lambda m: None)
    assert sorted((e.grid, e.cells, e.rows) for e in done) == [("ladder", 3, 6), ("synthetic", 1, 2)]
    pd.testing.assert_frame_equal(claims_table(spec, records), claims_table(spec, runs))
    # without its ladder's run the row says which grid makes it
    import shutil

    shutil.rmtree(runs / "cpu" / "ladder")
    r = claims_table(spec, runs).iloc[0]
    assert r["cpu_verdict"] == "" and "ladder.yaml --size cpu" in r["cpu_note"]


def test_a_surrogate_beyond_its_ladder_is_left_out_and_named(tmp_path):
    """densenet_b's attack fools it 95% of the time, above the ladder's 90% at 8/255: no data-space
    attack of the ladder matches it (no extrapolation), so the row pools resnet_a alone, as above,
    and names densenet_b as left out."""
    (tmp_path / "ladder.yaml").write_text(GRID.replace("name: synthetic", "name: ladder"))
    runs = tmp_path / "runs"
    _wb_runs(runs, "cpu", second_whitebox=0.95)
    spec = load_claims(_spec(tmp_path, sizes="[cpu]", by="whitebox", ladder=str(tmp_path / "ladder.yaml"),
                             a="ladder:mifgsm", b="repr_push"))
    df = claims_table(spec, runs)
    r = df.iloc[0]
    assert r["cpu_diff"] == pytest.approx(0.3) and r["cpu_n_surrogates"] == 1
    assert r["cpu_surrogates_unmatched"] == "densenet_b"
    assert "left out, white-box level outside the ladder: densenet_b" in format_claims(df, spec.sizes)
    # a regime other than the standard one gets one phrase in the table: it names the left-out too
    other = format_claims(pd.concat([df, df.assign(regime="eps16", eps="16/255")]), spec.sizes)
    assert "other regimes: eps16 (16/255): " in other
    assert other.split("other regimes: eps16")[1].count("left out, white-box level outside the ladder: densenet_b") == 1


def test_a_whitebox_claim_over_replicates_keeps_siblings_out_and_gives_their_range(tmp_path):
    """Replicate resnet_a@r1 reaches the same 60% white-box (the ladder's 4/255: 40% transfer) and
    transfers 20% to densenet_b: its own difference is +20 against resnet_a's +30, so the row pools
    +25 with the replicate range +20..+30. Each replicate's sibling (fooled 90% of the time, above
    every ladder point's transfer) is the same model at another seed, not a held-out victim: were
    it counted the pooled difference would move and the victims would be two."""
    (tmp_path / "ladder.yaml").write_text(GRID.replace("name: synthetic", "name: ladder"))
    runs = tmp_path / "runs"
    _wb_runs(runs, "cpu", replicate_transfer=0.2)
    spec = load_claims(_spec(tmp_path, sizes="[cpu]", by="whitebox", ladder=str(tmp_path / "ladder.yaml"),
                             a="ladder:mifgsm", b="repr_push", surrogates="[resnet_a]"))
    r = claims_table(spec, runs).iloc[0]
    assert r["cpu_diff"] == pytest.approx(0.25) and r["cpu_n_victims"] == 1 and r["cpu_n_surrogates"] == 2
    assert (r["cpu_rep_min"], r["cpu_rep_max"]) == pytest.approx((0.2, 0.3)) and r["cpu_n_replicates"] == 2
    assert r["cpu_verdict"] == "holds"


def test_held_out_victims_exclude_a_surrogates_models_and_their_replicates():
    """A victim is held out when it is neither one of the surrogate's models nor another seed of
    one: read from the label (``a@r1``, ``a+b``) and from the model names keying a named set's
    ``surrogate_params``."""
    import json

    from advtransfer.analysis.measures.claims import held_out

    ens = json.dumps({"resnet20_a@r1": {"epochs": 26}, "vgg_a@r1": {"epochs": 10}})
    rows = [("resnet20_a", "", "resnet20_a", True, False), ("resnet20_a", "", "resnet20_a@r1", False, False),
            ("resnet20_a", "", "vgg_a@r1", False, True), ("resnet20_a@r1", "", "resnet20_a", False, False),
            ("resnet20_a@r1", "", "resnet20_b", False, True), ("ens3@r1", ens, "vgg_a", False, False),
            ("ens3@r1", ens, "vgg_b", False, True), ("resnet20_a+vgg_a", "", "vgg_a@r2", False, False),
            ("lgv", "not json", "resnet20_a", False, True)]
    df = pd.DataFrame(rows, columns=["surrogate", "surrogate_params", "victim", "is_whitebox", "kept"])
    assert held_out(df)["kept"].all() and held_out(df)["kept"].sum() == df["kept"].sum()


# --- regimes --------------------------------------------------------------------------------------
REGIMES = """regimes:
  wide:
    label: "untargeted 8/255, 20 steps"
    sizes: [converged]
    set: {n: 500, defaults: {steps: 20}, attacks: {cwa2: {attack: cwa}}}
"""


def _regime_spec(tmp_path: Path, claim_regimes: str = "[wide]", paper: str = "wide") -> Path:
    path = _spec(tmp_path, regimes=claim_regimes, paper_regime=paper)
    text = path.read_text().replace("claims:\n", REGIMES + "claims:\n", 1)
    path.write_text(text)
    return path


def _with_hits(run: Path, b_fools_clean_wrong: bool) -> None:
    """Give a run's per-image tables the all-images column: ``hit`` = success, and on the images a
    victim gets wrong on x, B (the baseline) also meets the goal when ``b_fools_clean_wrong``."""
    for f in (run / "samples").glob("*.parquet"):
        s = pd.read_parquet(f)
        is_b = f.stem.endswith("b")
        s["hit"] = s["success"] | (~s["clean_correct"] & is_b & b_fools_clean_wrong)
        s.to_parquet(f, index=False)


def test_each_regime_is_a_row_with_holm_over_all_rows_and_one_label_per_claim(tmp_path, capsys):
    from advtransfer.analysis.measures.claims import format_regimes, regime_label
    from advtransfer.analysis.stats import holm
    from advtransfer.cli import main

    runs = tmp_path / "runs"
    make_run(runs / "converged" / "synthetic", replicates=3)
    wide = make_run(runs / "converged" / "synthetic@wide", replicates=3)
    for f in (wide / "samples").glob("cwa*.parquet"):  # in the other regime A never succeeds: B wins there
        s = pd.read_parquet(f)
        s["success"] = False
        s.to_parquet(f, index=False)
    _with_hits(wide, b_fools_clean_wrong=True)
    spec = load_claims(_regime_spec(tmp_path))
    assert [c.regime for c in spec.measured("converged")] == ["standard", "wide"]
    assert spec.runs("converged") == [(str(tmp_path / "grid.yaml"), "standard"), (str(tmp_path / "grid.yaml"), "wide")]
    df = claims_table(spec, runs)
    assert list(df["regime"]) == ["standard", "wide"] and list(df["paper_regime"]) == [False, True]
    std, wd = df.iloc[0], df.iloc[1]
    assert std["converged_verdict"] == "holds" and wd["converged_verdict"] == "does not hold"
    # Holm runs over every (claim, regime) row of a size, not per claim
    assert [std["converged_p_holm"], wd["converged_p_holm"]] == pytest.approx(list(holm(np.array([std["converged_p"], wd["converged_p"]]))))
    label = "regime-dependent: holds in standard; not in wide (does not hold)"
    assert std["converged_label"] == wd["converged_label"] == label
    # the regime is measured on the converged zoo only: the cpu rows say so, and the cpu label is empty
    assert "measured at the converged zoo only" in wd["cpu_note"] and wd["cpu_label"] == ""
    # the all-images difference where the records have `hit`: B also fools every clean-wrong image,
    # so over all pairs B gains exactly those images (A: 0 successes)
    n_all = 3 * len(DESIGN) * N
    wrong = sum((~pd.read_parquet(f)["clean_correct"]).sum() for f in (wide / "samples").glob("mifgsm*.parquet"))
    assert wd["converged_all_n_pairs"] == n_all and wd["converged_all_asr_a"] == 0
    b_hits = sum(pd.read_parquet(f)["hit"].sum() for f in (wide / "samples").glob("mifgsm*.parquet"))
    assert wd["converged_all_diff"] == pytest.approx(-b_hits / n_all) and b_hits > wrong > 0
    assert pd.isna(std.get("converged_all_diff"))  # the standard run has no hit column
    # the Markdown: one row per claim leading with the label; the full table one row per regime
    text = format_claims(df, spec.sizes)
    assert len(text.splitlines()) == 3 and f"*{label}*" in text and "other regimes: wide (8/255): does not hold" in text
    full = format_regimes(df, spec.sizes)
    assert len(full.splitlines()) == 4 and "(the paper's)" in full and "over all images" in full
    # what make claims-runs runs for the regime: its own folder, -n and --set
    assert main(["claims", str(_regime_spec(tmp_path)), "--list-grids", "--size", "converged"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (f"synthetic@wide\t{tmp_path / 'grid.yaml'} -n 500 --set defaults.steps=20 "
                        "--set attacks.cwa2.attack=cwa")
    # the labels by hand
    assert regime_label([("standard", "holds"), ("eps4", "holds")]) == "holds in every regime tested (2)"
    assert regime_label([("standard", "cannot tell"), ("eps4", "does not hold")]) == "holds in no regime tested (2)"
    assert regime_label([("standard", "holds"), ("eps4", "")]) == "holds (one regime measured: standard)"
    assert regime_label([("standard", "")]) == ""


def test_a_regime_can_change_the_claim_and_its_records_keep_the_hits(tmp_path):
    from advtransfer.analysis.measures.claim_records import export_records

    runs = tmp_path / "runs"
    make_run(runs / "converged" / "synthetic", replicates=1)
    wide = make_run(runs / "converged" / "synthetic@wide", replicates=1)
    df = pd.read_parquet(wide / "results.parquet")  # in the regime's run the claim's attack is labelled cwa2
    df.loc[df["attack_label"] == "cwa", "attack_label"] = "cwa2"
    df["baseline_for"] = df["baseline_for"].replace("cwa", "cwa2")
    df.to_parquet(wide / "results.parquet", index=False)
    _with_hits(wide, b_fools_clean_wrong=False)
    for run in (runs / "converged" / "synthetic", wide):
        _finish(run)
    spec = load_claims(_regime_spec(tmp_path, claim_regimes="{wide: {a: cwa2}}"))
    assert spec.claims[0].at("converged", "wide").a == "cwa2"
    direct = claims_table(spec, runs)
    export_records(spec, runs, tmp_path / "records", log=lambda m: None)
    rec = tmp_path / "records" / "converged" / "synthetic@wide"
    assert all("hit" in pd.read_parquet(f).columns for f in (rec / "samples").glob("*.parquet"))
    pd.testing.assert_frame_equal(claims_table(spec, tmp_path / "records"), direct)
    # with no clean-wrong image fooled beyond the successes, the two denominators differ only in the pairs
    r = direct.iloc[1]
    assert r["converged_all_diff"] * r["converged_all_n_pairs"] == pytest.approx(r["converged_diff"] * r["converged_n_pairs"])


@pytest.mark.parametrize("claim_regimes, paper, message", [
    ("[wdie]", "null", "unknown regime 'wdie'; did you mean 'wide'"),
    ("[wide]", "eps4", "paper_regime 'eps4' is not one of the claim's regimes"),
    ("{wide: {colour: red}}", "null", "regimes.wide may only set"),
])
def test_bad_regimes_are_one_line(tmp_path, claim_regimes, paper, message):
    path = _regime_spec(tmp_path, claim_regimes=claim_regimes, paper=paper)
    with pytest.raises(UserError, match=re.escape(message)):
        load_claims(path)
    path.write_text(path.read_text().replace("    label:", "    colour: red\n    label:"))
    with pytest.raises(UserError, match=re.escape("regime 'wide': unknown key(s) colour")):
        load_claims(path)


def test_a_regime_runs_its_own_attack_labels_in_each_grid(tmp_path, capsys):
    """``attacks:`` as a mapping grid → labels: each grid's run gets its own --attack (a grid the
    mapping does not name runs every attack); a grid no claim measures in the regime is refused."""
    from advtransfer.cli import main

    path = _regime_spec(tmp_path)
    grid = str(tmp_path / "grid.yaml")
    text = path.read_text()
    path.write_text(text.replace("    sizes: [converged]\n", f"    sizes: [converged]\n    attacks: {{{grid}: [cwa]}}\n", 1))
    spec = load_claims(path)
    assert spec.regimes["wide"].labels(grid) == ("cwa",) and spec.regimes["wide"].labels("other") == ()
    assert main(["claims", str(path), "--list-grids", "--size", "converged"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith(f"synthetic@wide\t{grid} -n 500 --attack cwa --set ")
    assert "--attack" not in lines[0]  # the standard regime runs the grid as written
    path.write_text(text.replace("    sizes: [converged]\n", "    sizes: [converged]\n    attacks: {ensembel: [cwa]}\n", 1))
    with pytest.raises(UserError, match="attacks names grid 'ensembel', which no claim measures"):
        load_claims(path)
    path.write_text(text.replace("    sizes: [converged]\n", "    sizes: [converged]\n    attacks: {ensemble: cwa}\n", 1))
    with pytest.raises(UserError, match="map grids to their labels"):
        load_claims(path)


def test_a_regime_that_changes_nothing_is_named_and_not_counted_in_the_label(tmp_path):
    """A regime whose run repeats another's per-image outcomes exactly (its settings changed nothing
    the attacks did, e.g. a step size the attack already used) is flagged and left out of the label,
    so one measurement never counts as two regimes."""
    import shutil

    runs = tmp_path / "runs"
    std = make_run(runs / "converged" / "synthetic", replicates=3)
    shutil.copytree(std, runs / "converged" / "synthetic@wide")
    df = claims_table(load_claims(_regime_spec(tmp_path)), runs)
    s, w = df.iloc[0], df.iloc[1]
    assert s["converged_same_as"] == "" and w["converged_same_as"] == "standard"
    assert s["converged_outcomes_sha"] == w["converged_outcomes_sha"]
    assert w["converged_label"] == f"{s['converged_verdict']} (one regime measured: standard)"
    assert "the same per-image outcomes as standard" in format_claims(df, ("converged", "cpu"))
    # one image's outcome differs: a measurement of its own, counted
    wide = runs / "converged" / "synthetic@wide"
    f = sorted((wide / "samples").glob("cwa*.parquet"))[0]
    t = pd.read_parquet(f)
    t.loc[t.index[t["clean_correct"]][0], "success"] ^= True
    t.to_parquet(f, index=False)
    df = claims_table(load_claims(_regime_spec(tmp_path)), runs)
    assert df.iloc[1]["converged_same_as"] == "" and "(2)" in df.iloc[1]["converged_label"]


def test_a_whitebox_regime_can_read_the_standard_ladder(tmp_path):
    """``ladder_regime: standard``: the attack's run in the regime is matched on the ladder as run in
    the standard regime (radii that bracket its white-box level, the same steps); without it the
    regime needs its own ladder run and says which."""
    import shutil

    from advtransfer.analysis.measures.claim_records import export_records

    (tmp_path / "ladder.yaml").write_text(GRID.replace("name: synthetic", "name: ladder"))
    runs, records = tmp_path / "runs", tmp_path / "records"
    _wb_runs(runs, "cpu")
    shutil.copytree(runs / "cpu" / "synthetic", runs / "cpu" / "synthetic@wide")
    regimes = 'regimes:\n  wide:\n    label: "another attack setting"\n    set: {n: 500}\n'

    def spec_with(claim_regimes: str):
        path = _spec(tmp_path, sizes="[cpu]", by="whitebox", ladder=str(tmp_path / "ladder.yaml"),
                     a="ladder:mifgsm", b="repr_push", regimes=claim_regimes)
        path.write_text(path.read_text().replace("claims:\n", regimes + "claims:\n", 1))
        return load_claims(path)

    spec = spec_with("{wide: {ladder_regime: standard}}")
    assert (str(tmp_path / "ladder.yaml"), "wide") not in spec.runs("cpu")
    df = claims_table(spec, runs)
    assert list(df["regime"]) == ["standard", "wide"] and df.iloc[1]["cpu_diff"] == pytest.approx(0.3)
    export_records(spec, runs, records, log=lambda m: None)
    pd.testing.assert_frame_equal(claims_table(spec, records), df)
    own = claims_table(spec_with("[wide]"), runs).iloc[1]
    assert own["cpu_verdict"] == "" and "--out RUNS/cpu/ladder@wide" in own["cpu_note"]
    with pytest.raises(UserError, match="ladder_regime 'stnadard' is not a regime of the file"):
        spec_with("{wide: {ladder_regime: stnadard}}")
