"""Paired statistics against hand-computed values and published worked examples."""
from __future__ import annotations

import math

import numpy as np
import pytest

from advtransfer.analysis.stats import (compare_paired, holm, mcnemar_exact, newcombe_paired_ci,
                                        paired_bootstrap_ci, stratified_paired_test, verdict)
from advtransfer.core.metrics import wilson_interval


def test_mcnemar_exact_by_hand():
    # b=10, c=2: p = 2 * sum_{k<=2} C(12,k) / 2^12 = 2 * (1 + 12 + 66) / 4096 = 158/4096
    assert mcnemar_exact(10, 2) == pytest.approx(158 / 4096, abs=1e-12)
    assert mcnemar_exact(10, 2) == pytest.approx(0.03857, abs=1e-5)
    # symmetric in b and c; no discordant pair -> 1; balanced -> 1 (capped)
    assert mcnemar_exact(2, 10) == mcnemar_exact(10, 2)
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(5, 5) == 1.0
    # b=5, c=0: 2 / 2^5
    assert mcnemar_exact(5, 0) == pytest.approx(2 / 32)


def test_wilson_by_hand():
    # k=5 of n=10, z=1.959964: centre 0.5, half = z*sqrt(0.025 + z^2/400)/(1+z^2/10)
    z = 1.959963984540054
    half = z * math.sqrt(0.25 / 10 + z * z / 400) / (1 + z * z / 10)
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.5 - half) and hi == pytest.approx(0.5 + half)
    assert lo == pytest.approx(0.2366, abs=1e-4)
    assert math.isnan(wilson_interval(0, 0)[0])
    # one implementation for the results table and for Newcombe's interval: its default z is the
    # 95% quantile Newcombe passes, so a 95% interval is the same number in both
    from scipy.stats import norm

    assert wilson_interval(5, 10) == wilson_interval(5, 10, float(norm.ppf(0.975)))


@pytest.mark.parametrize("table, expected", [
    # Newcombe (1998) Stat Med 17:2635, worked examples of method 10 (as tabulated in the paper)
    ((36, 12, 2, 0), (0.0569, 0.3404)),
    ((18, 12, 2, 18), (0.0562, 0.3290)),
    ((53, 0, 0, 1), (-0.0729, 0.0729)),
    ((0, 30, 0, 0), (0.8395, 1.0)),
])
def test_newcombe_paper_examples(table, expected):
    lo, hi = newcombe_paired_ci(*table)
    assert lo == pytest.approx(expected[0], abs=1e-4)
    assert hi == pytest.approx(expected[1], abs=1e-4)


def test_newcombe_by_hand():
    # (a,b,c,d) = (36,12,2,0), n=50: p_a = 48/50 = 0.96, p_b = 38/50 = 0.76, D = 0.2.
    # Wilson(48,50) = (0.8654, 0.9890); Wilson(38,50) = (0.6259, 0.8570).
    # ad - bc = 0 - 24 <= 0 (no correction): phi = -24/sqrt(48*2*38*12) = -0.1147.
    # delta = sqrt(0.0946^2 + 2*0.1147*0.0946*0.0970 + 0.0970^2) = 0.1431 -> L = 0.0569
    # eps   = sqrt(0.0290^2 + 2*0.1147*0.0290*0.1341 + 0.1341^2) = 0.1404 -> U = 0.3404
    w1, w2 = wilson_interval(48, 50), wilson_interval(38, 50)
    assert w1 == pytest.approx((0.8654, 0.9890), abs=1e-4)
    assert w2 == pytest.approx((0.6259, 0.8570), abs=1e-4)
    phi = -24 / math.sqrt(48 * 2 * 38 * 12)
    assert phi == pytest.approx(-0.1147, abs=1e-4)
    delta = math.sqrt((0.96 - w1[0]) ** 2 - 2 * phi * (0.96 - w1[0]) * (w2[1] - 0.76) + (w2[1] - 0.76) ** 2)
    eps = math.sqrt((w1[1] - 0.96) ** 2 - 2 * phi * (w1[1] - 0.96) * (0.76 - w2[0]) + (0.76 - w2[0]) ** 2)
    assert newcombe_paired_ci(36, 12, 2, 0) == pytest.approx((0.2 - delta, 0.2 + eps), abs=1e-12)
    # degenerate: no pair -> NaN; all concordant -> interval contains 0 and is symmetric
    assert all(math.isnan(v) for v in newcombe_paired_ci(0, 0, 0, 0))
    lo, hi = newcombe_paired_ci(10, 0, 0, 10)
    assert lo < 0 < hi and lo == pytest.approx(-hi)
    # swapping A and B mirrors the interval
    lo2, hi2 = newcombe_paired_ci(36, 2, 12, 0)
    assert (lo2, hi2) == pytest.approx((-0.3404, -0.0569), abs=1e-4)


def test_holm_by_hand():
    # sorted p: 0.01, 0.02, 0.03, 0.5 (m=4): 4*0.01=0.04, 3*0.02=0.06, 2*0.03=0.06, 1*0.5=0.5
    p = [0.03, 0.5, 0.01, 0.02]
    assert holm(p) == pytest.approx([0.06, 0.5, 0.04, 0.06])
    # monotone step-down: 0.04*3 = 0.12 would undercut the running max? sorted 0.001, 0.04, 0.045:
    # 3*0.001=0.003, 2*0.04=0.08, 1*0.045=0.045 -> max-accumulate -> 0.08
    assert holm([0.045, 0.001, 0.04]) == pytest.approx([0.08, 0.003, 0.08])
    # capped at 1; NaN kept and not counted
    out = holm([0.6, np.nan, 0.7])
    assert out[0] == pytest.approx(1.0) and out[2] == pytest.approx(1.0) and np.isnan(out[1])
    assert holm([]).size == 0


def test_verdict():
    assert verdict(0.1, 0.01) == "a_better"
    assert verdict(-0.1, 0.049) == "b_better"
    assert verdict(0.1, 0.05) == "no_difference"
    assert verdict(0.1, float("nan")) == "no_difference"


def test_bootstrap_close_to_newcombe_on_large_sample():
    # n = 4000 pairs: 400 A-only, 300 B-only. Both intervals are ~ D ± 1.96 sqrt((b+c)/n^2 - D^2/n)
    # = 0.025 ± 0.0129; the bootstrap's percentile limits should agree with Newcombe's to ~0.002.
    rng = np.random.default_rng(1)
    kind = rng.permutation(np.repeat([0, 1, 2, 3], [1500, 400, 300, 1800]))
    sa, sb = np.isin(kind, [0, 1]), np.isin(kind, [0, 2])
    nc = newcombe_paired_ci(1500, 400, 300, 1800)
    bs = paired_bootstrap_ci(sa, sb, n_resamples=10_000, seed=0)
    assert bs == pytest.approx(nc, abs=0.002)
    # seeded: same seed, same interval; clustering by singleton clusters is the same bootstrap in law
    assert paired_bootstrap_ci(sa, sb, seed=0) == bs
    bc = paired_bootstrap_ci(sa, sb, cluster=np.arange(sa.size), seed=0)
    assert bc == pytest.approx(nc, abs=0.003)


def test_stratified_pooled_and_spread():
    # two replicates on 100 images: rep0 b=12, c=2; rep1 b=8, c=4 -> pooled b=20, c=6
    t = [(30, 12, 2, 56), (30, 8, 4, 58)]
    pooled, p, per = stratified_paired_test(t)
    assert pooled == pytest.approx((20 - 6) / 200)
    assert per == pytest.approx([0.10, 0.04])
    assert p == pytest.approx(mcnemar_exact(20, 6))
    # 2 * sum_{k<=6} C(26,k) / 2^26
    assert p == pytest.approx(2 * sum(math.comb(26, k) for k in range(7)) / 2 ** 26)
    # the same through compare_paired on per-image outcomes
    sa, sb, strata = [], [], []
    for s, (a, b, c, d) in enumerate(t):
        sa += [1] * a + [1] * b + [0] * c + [0] * d
        sb += [1] * a + [0] * b + [1] * c + [0] * d
        strata += [s] * (a + b + c + d)
    r = compare_paired(np.array(sa), np.array(sb), strata=np.array(strata))
    assert (r.n_pairs, r.n_a_only, r.n_b_only, r.n_strata) == (200, 20, 6, 2)
    assert r.diff == pytest.approx(0.07) and r.p_mcnemar == pytest.approx(p)
    assert (r.diff_rep_min, r.diff_rep_max) == pytest.approx((0.04, 0.10))
    assert r.diff_rep_sd == pytest.approx(math.sqrt(2 * 0.03 ** 2))
    assert (r.diff_ci_low, r.diff_ci_high) == pytest.approx(newcombe_paired_ci(60, 20, 6, 114))
    rb = compare_paired(np.array(sa), np.array(sb), strata=np.array(strata),
                        cluster=np.tile(np.arange(100), 2), method="bootstrap")
    assert rb.diff_ci_low < 0.07 < rb.diff_ci_high and rb.method == "bootstrap"


def test_cluster_bootstrap_draws_are_kept_not_changed():
    """The cluster bootstrap keeps its resampling counts per (clusters, resamples, seed), since a
    claims table asks for the same ones dozens of times: a kept draw gives exactly the interval of
    a fresh one, for another comparison too, and a large draw (not kept) the same as if kept."""
    from advtransfer.analysis import stats

    rng = np.random.default_rng(7)
    cl = rng.integers(0, 300, 2000)
    a, b = rng.random(2000) < 0.5, rng.random(2000) < 0.4
    stats._cached_cluster_weights.cache_clear()
    fresh = stats.paired_bootstrap_ci(a, b, cluster=cl, seed=3)
    other_fresh = (stats._cached_cluster_weights.cache_clear(), stats.paired_bootstrap_ci(b, a, cluster=cl, seed=3))[1]
    assert stats.paired_bootstrap_ci(a, b, cluster=cl, seed=3) == fresh  # from the kept draw
    assert stats._cached_cluster_weights.cache_info().hits == 1
    assert stats.paired_bootstrap_ci(b, a, cluster=cl, seed=3) == other_fresh
    assert stats.paired_bootstrap_ci(a, b, cluster=cl, seed=4) != fresh  # another seed, another draw
    kept = [w for _, w in stats._cached_cluster_weights(300, 100_000, 0)]
    drawn = [w for _, w in stats._draw_cluster_weights(300, 100_000, 0)]
    assert all(np.array_equal(x, y) for x, y in zip(kept, drawn)) and len(kept) == len(drawn)
