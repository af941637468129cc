"""Transfer at equal white-box success (advtransfer.analysis.measures.whitebox_match)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from advtransfer.analysis.measures.whitebox_match import _interp, check_same_weights
from advtransfer.core.errors import UserError


def test_interpolation_on_the_ladder():
    eps = np.array([1.0, 2.0, 4.0])
    w = np.array([[0.2, 0.5, 0.9], [0.2, 0.5, 0.9], [0.2, 0.5, 0.9]])
    t = np.array([[0.1, 0.3, 0.6]] * 3)
    got_t, got_e = _interp(np.array([0.35, 0.95, 0.1]), w, t, eps)
    assert got_t[0] == pytest.approx(0.2) and got_e[0] == pytest.approx(1.5)
    assert np.isnan(got_t[1]) and np.isnan(got_t[2])  # outside the ladder: no extrapolation
    # a dip (noise) is made monotone: more budget never fools fewer images
    got_t, _ = _interp(np.array([0.5]), np.array([[0.2, 0.5, 0.45, 0.9]]), np.array([[0.1, 0.3, 0.2, 0.6]]),
                       np.array([1.0, 2.0, 3.0, 4.0]))
    assert got_t[0] == pytest.approx(0.3)
    # a saturated ladder: the smallest radius reaching the level is the match
    got_t, got_e = _interp(np.array([1.0]), np.array([[0.4, 1.0, 1.0]]), np.array([[0.1, 0.3, 0.5]]), eps)
    assert got_t[0] == pytest.approx(0.3) and got_e[0] == pytest.approx(2.0)


def _interp_reference(w_a, w, t, eps):
    """The per-resample loop _interp replaced: np.interp on the monotone ladder, equal levels dropped."""
    w = np.maximum.accumulate(np.nan_to_num(w, nan=-1.0), axis=1)
    t = np.maximum.accumulate(np.nan_to_num(t, nan=-1.0), axis=1)
    out_t, out_e = np.full(len(w_a), np.nan), np.full(len(w_a), np.nan)
    for b in range(len(w_a)):
        wb = w[b]
        if not np.isfinite(w_a[b]) or w_a[b] < wb[0] or w_a[b] > wb[-1] or wb[0] < 0:
            continue
        keep = np.concatenate(([True], wb[1:] != wb[:-1]))
        out_t[b] = np.interp(w_a[b], wb[keep], t[b][keep])
        out_e[b] = np.interp(w_a[b], wb[keep], eps[keep])
    return out_t, out_e


def test_vectorised_interpolation_is_np_interp_bit_for_bit():
    """_interp works on all resamples at once; it must give exactly what np.interp gives per
    resample (the claims table's intervals are read from these), on ladders with dips, saturated
    runs of equal levels, NaN radii and levels on, between, below and above the ladder's points."""
    rng = np.random.default_rng(0)
    B, K = 4000, 6
    eps = np.array([1, 2, 3, 4, 6, 8]) / 255
    w = np.round(rng.uniform(0, 1, (B, K)), 1)  # coarse levels: many ties and saturated runs
    t = np.round(rng.uniform(0, 1, (B, K)), 2)
    w[rng.random((B, K)) < 0.03] = np.nan
    w_a = np.where(rng.random(B) < 0.5, np.round(rng.uniform(-0.1, 1.1, B), 1), rng.uniform(-0.1, 1.1, B))
    w_a[:50] = np.nan
    got, want = _interp(w_a, w, t, eps), _interp_reference(w_a, w, t, eps)
    for g, r in zip(got, want):
        assert np.array_equal(g, r, equal_nan=True)
    assert 0.3 < np.isfinite(got[0]).mean() < 0.9  # both matched and unmatched resamples were exercised


def test_runs_on_other_weights_are_not_paired():
    """Pairing two runs by model name is right only when both evaluated the same weights under it:
    a ladder run on a retrained zoo must be refused, naming the model, not matched."""
    def rows(sur_sha: str, vic_sha: str) -> pd.DataFrame:
        return pd.DataFrame({"surrogate": ["resnet20_a"] * 2, "surrogate_sha": [sur_sha] * 2,
                             "victim": ["resnet20_a", "vgg_a"], "victim_sha": [sur_sha, vic_sha]})

    check_same_weights(rows("a" * 64, "b" * 64), rows("a" * 64, "b" * 64), "atk", "ladder")  # same zoo
    check_same_weights(rows("a" * 64, "b" * 64), rows("a" * 64, "b" * 64).drop(columns=["surrogate_sha",
                       "victim_sha"]), "atk", "ladder")  # a run from before the sha columns: nothing to compare
    for other in (rows("c" * 64, "b" * 64), rows("a" * 64, "d" * 64)):  # a retrained surrogate, a retrained victim
        with pytest.raises(UserError, match="different weights of (resnet20_a|vgg_a)") as e:
            check_same_weights(rows("a" * 64, "b" * 64), other, "atk", "ladder")
        assert "\n" not in str(e.value) and "same trained zoo" in str(e.value)
    # one run holding two weights under one name is as ambiguous
    with pytest.raises(UserError, match="different weights of vgg_a"):
        check_same_weights(pd.concat([rows("a" * 64, "b" * 64), rows("a" * 64, "d" * 64)]), rows("a" * 64, "b" * 64),
                           "atk", "ladder")


def test_an_attack_matched_with_its_own_ladder_differs_by_zero(tmp_path, trained):
    """MI-FGSM at 4/255 in the attack run, and the same MI-FGSM at 1, 4 and 8/255 in the ladder:
    the white-box level is the ladder's own 4/255 point (or ties with 8/255 at saturation, where
    the smallest radius is the match), so the matched transfer is its 4/255 transfer (the same
    examples) and the difference is exactly 0 in every resample. A
    representation-space attack gets a matched eps inside the ladder, and a finite interval unless
    its white-box level sits so near an end of the ladder that over 10% of resamples fall outside
    it (then NaN, as bootstrap_interval documents)."""
    from advtransfer.cli import main
    from advtransfer.grid import load_grid
    from advtransfer.run.context import RunContext
    from advtransfer.run.runner import run_grid

    trained("resnet20_a"), trained("vgg_a")
    common = {"dataset": "cifar10", "n": 60, "size": "ci", "batch_size": 60, "defaults": {"steps": 5},
              "surrogates": ["resnet20_a"], "victims": ["resnet20_a", "vgg_a"]}
    runs = {}
    for name, extra in {"atk": {"eps": ["4/255"], "attacks": {"mi4": {"attack": "mifgsm"}, "repr_push": {}}},
                        "ladder": {"eps": ["1/255", "4/255", "8/255"], "attacks": {"mifgsm": {}}}}.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, **common, **extra}))
        runs[name] = run_grid(load_grid(str(tmp_path / f"{name}.yaml")), RunContext(tmp_path / name, progress=False),
                              log=lambda *_: None)
    assert main(["whitebox-match", str(runs["atk"]), "--ladder", str(runs["ladder"]), "--attack", "mi4,repr_push"]) == 0
    per = pd.read_csv(runs["atk"] / "whitebox_match.csv")
    mi = per[per["attack"] == "mi4"].iloc[0]
    assert mi["victim"] == "vgg_a" and mi["eps_matched"] == pytest.approx(4.0)
    assert mi["diff"] == pytest.approx(0.0, abs=1e-12)
    assert mi["diff_ci_low"] == pytest.approx(0.0, abs=1e-12) and mi["diff_ci_high"] == pytest.approx(0.0, abs=1e-12)
    rp = per[per["attack"] == "repr_push"].iloc[0]
    if np.isfinite(rp["eps_matched"]):  # its white-box level lies inside the ladder
        assert 1.0 <= rp["eps_matched"] <= 8.0
        if np.isfinite(rp["diff_ci_low"]):
            assert rp["diff_ci_low"] <= rp["diff"] <= rp["diff_ci_high"]
        else:  # NaN only as documented: over 10% of the resamples put its white-box level outside the ladder
            # (measured on one machine's ci models: matched at 1.18/255, just above the ladder's 1/255)
            from advtransfer.analysis.measures.whitebox_match import matched_pairs

            pair = next(p for p in matched_pairs(runs["atk"], runs["ladder"], ["repr_push"]) if p.victim == rp["victim"])
            assert np.isnan(pair.boot_diff).mean() > 0.1
    assert main(["whitebox-match", str(runs["atk"]), "--ladder", str(runs["ladder"]), "--attack", "nope"]) == 2
    # the same ladder, but as if its victim vgg_a had been retrained: refused, not matched
    import shutil

    other = tmp_path / "ladder-retrained"
    shutil.copytree(runs["ladder"], other)
    res = pd.read_parquet(other / "results.parquet")
    res.loc[res["victim"] == "vgg_a", "victim_sha"] = "0" * 64
    res.to_parquet(other / "results.parquet", index=False)
    assert main(["whitebox-match", str(runs["atk"]), "--ladder", str(other), "--attack", "mi4"]) == 2
