"""Hand-computed cases for the distortion analyses: union over attacks, ASR-vs-ε curve, SAT, and
FiT's normalised mutual information."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from advtransfer.analysis.measures.exposure import asr_eps_curve, exposure_table
from advtransfer.analysis.measures.fit import nmi_errors, prediction_entropy
from advtransfer.analysis.measures.similarity import sat_pair


def _fake_run(tmp_path):
    """Victim V, 4 images (image 3 misclassified by V), eps 8/255, cells A (fools 0, 1) and
    B (fools 1, 2), plus a white-box cell W (fools everything) that the union leaves out."""
    res, samples = [], {}
    fooled = {"cA": [1, 1, 0, 0], "cB": [0, 1, 1, 0], "cW": [1, 1, 1, 0]}
    mlinf = {"cA": [2, 3, np.inf, 0], "cB": [np.inf, 1, 5, 0], "cW": [1, 1, 1, 0]}
    for cid, sur in (("cA", "A"), ("cB", "B"), ("cW", "V")):
        res.append({"cell_id": cid, "victim": "V", "surrogate": sur, "attack_label": "mifgsm", "eps": 8 / 255,
                    "eps_str": "8/255", "targeted": False, "is_whitebox": sur == "V", "n": 4,
                    "asr": sum(fooled[cid]) / 3, "zoo_size": "ci"})
        samples[cid] = pd.DataFrame({"cell_id": cid, "victim": "V", "index": [0, 1, 2, 3],
                                     "clean_correct": [True, True, True, False],
                                     "success": np.array(fooled[cid], bool), "adv_pred": 0,
                                     "min_linf": np.array(mlinf[cid], float) / 255, "min_l2": 0.1,
                                     "min_scale": 1.0, "queries": 5})
    pd.DataFrame(res).to_parquet(tmp_path / "results.parquet")
    (tmp_path / "samples").mkdir()
    for cid, df in samples.items():
        df.to_parquet(tmp_path / "samples" / f"{cid}.parquet")
    return tmp_path


def test_union_over_attacks_hand_computed(tmp_path):
    table, images = exposure_table(_fake_run(tmp_path))
    r = table.iloc[0]
    assert r.n_cells == 2                         # white-box cell left out
    assert r.asr_union == pytest.approx(3 / 3)    # A ∪ B fools images 0, 1, 2
    assert r.asr_best_member == pytest.approx(2 / 3) and r.asr_union >= r.asr_best_member
    assert r.robust_acc_union == pytest.approx(0 / 4)
    # minimal distortion over A and B per clean-correct image: 2, 1, 5 (/255) -> median 2/255
    assert r.median_min_linf == pytest.approx(2 / 255)
    wb, _ = exposure_table(tmp_path, include_whitebox=True, write=False)
    assert wb.iloc[0].n_cells == 3 and wb.iloc[0].median_min_linf == pytest.approx(1 / 255)


def test_asr_eps_curve_monotone_and_exact():
    ml = np.array([1, 3, np.inf, 0, 2]) / 255
    cc = np.array([True, True, True, False, True])
    grid = np.arange(0, 9) / 255
    c = asr_eps_curve(ml, cc, grid)
    assert np.all(np.diff(c) >= 0)
    assert c.tolist() == [0, .25, .5, .75, .75, .75, .75, .75, .75]


def test_sat_pair_hand_computed():
    # 5 images; X_AB = images 0, 1, 3 (2: B wrong on x; 4: A's own attack failed)
    a_ok = [1, 1, 1, 1, 1]
    b_ok = [1, 1, 0, 1, 1]
    a_own = [1, 1, 1, 1, 0]
    b_own = [1, 1, 1, 1, 1]
    a_by_b = [1, 0, 1, 0, 1]     # on X_AB: 1
    b_by_a = [1, 1, 0, 0, 0]     # on X_AB: 2
    sat, n = sat_pair(a_ok, b_ok, a_own, b_own, a_by_b, b_by_a)
    assert n == 3 and sat == pytest.approx(math.log(100 * 3 / 6))
    sat0, _ = sat_pair(a_ok, b_ok, a_own, b_own, [0] * 5, [0] * 5)
    assert sat0 == pytest.approx(math.log(0.1))   # floored at ε_s
    assert math.isnan(sat_pair([0] * 5, b_ok, a_own, b_own, a_by_b, b_by_a)[0])


def test_nmi_and_entropy_hand_computed():
    assert nmi_errors([0, 1, 0, 1], [0, 1, 0, 1]) == pytest.approx(1.0)
    assert nmi_errors([0, 1, 0, 1], [0, 0, 1, 1]) == pytest.approx(0.0)
    # e_s = (0,0,1,1), e_v = (0,0,0,1): H(e_s)=1, H(e_v)=H(1/4)=0.8113, H(joint)=1.5 -> I=0.3113
    h = -(0.25 * math.log2(0.25) + 0.75 * math.log2(0.75))
    assert nmi_errors([0, 0, 1, 1], [0, 0, 0, 1]) == pytest.approx((1 + h - 1.5) / h)
    assert math.isnan(nmi_errors([0, 0, 0], [0, 1, 0]))
    assert prediction_entropy(np.array([[1, 2], [1, 3]])).tolist() == [0.0, 1.0]
