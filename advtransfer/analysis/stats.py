"""Paired statistics for comparing two attacks on the same images and victim.

Every function here is pure (numpy/scipy, no torch, no files). Rates are fractions in [0, 1];
differences are ``p_a - p_b`` in the same unit (the report prints percentage points).

Data layout: a paired comparison of attack A against attack B on ``n`` images is the 2×2 table
``(a, b, c, d)`` = (both succeed, A only, B only, neither). McNemar's discordant counts are
``b`` and ``c``; the success rates are ``p_a = (a + b) / n`` and ``p_b = (a + c) / n``.

Surrogate replicates (the same attack crafted on independently seeded copies of the surrogate)
are *strata*: one 2×2 table per replicate, on the same images.

Also the per-victim summary of the decision-based yardstick's minimal distortions
(:func:`summarize_blackbox`), shared by the blackbox measure, its command and the report.
"""
from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

ALPHA = 0.05
VERDICTS = ("a_better", "b_better", "no_difference")


def _z(conf: float) -> float:
    if not 0.0 < conf < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {conf}")
    from scipy.stats import norm  # imported when needed: scipy.stats costs every run seconds of start-up

    return float(norm.ppf(0.5 + conf / 2))


def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value from the discordant counts ``b`` (A only) and ``c`` (B only).

    Conditional on the ``b + c`` discordant pairs, ``b ~ Binomial(b + c, 1/2)`` under the null of
    equal success rates; the p-value is scipy's two-sided binomial test (for p = 1/2 this is
    ``min(1, 2 * P(X <= min(b, c)))``). Returns 1.0 when there is no discordant pair.
    """
    b, c = int(b), int(c)
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be non-negative, got b={b}, c={c}")
    if b + c == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(min(1.0, binomtest(b, b + c, 0.5, alternative="two-sided").pvalue))


def newcombe_paired_ci(a: int, b: int, c: int, d: int, conf: float = 0.95) -> tuple[float, float]:
    """Newcombe's (1998, Stat Med 17:2635, method 10) interval for ``p_a - p_b`` from a paired 2×2 table.

    ``(a, b, c, d)`` = (both succeed, A only, B only, neither). With Wilson intervals
    ``(l1, u1)`` of ``p_a = (a+b)/n`` and ``(l2, u2)`` of ``p_b = (a+c)/n`` and the correlation
    ``phi`` of the two outcomes, the limits are ``D - delta`` and ``D + epsilon`` with
    ``delta = sqrt((p_a-l1)^2 - 2 phi (p_a-l1)(u2-p_b) + (u2-p_b)^2)`` and
    ``epsilon = sqrt((u1-p_a)^2 - 2 phi (u1-p_a)(p_b-l2) + (p_b-l2)^2)``.
    As in the paper, ``phi = (ad - bc) / sqrt((a+b)(c+d)(a+c)(b+d))`` with ``ad - bc`` replaced by
    ``max(ad - bc - n/2, 0)`` when ``ad > bc``, and ``phi = 0`` when a margin is empty
    (this reproduces the paper's worked examples, e.g. (36, 12, 2, 0) -> [0.0569, 0.3404]).
    Degenerate cases: n = 0 gives ``(nan, nan)``; limits are clipped to [-1, 1].
    """
    a, b, c, d = (int(v) for v in (a, b, c, d))
    if min(a, b, c, d) < 0:
        raise ValueError(f"table counts must be non-negative, got {(a, b, c, d)}")
    n = a + b + c + d
    if n == 0:
        return (math.nan, math.nan)
    from ..core.metrics import wilson_interval  # the harness's one Wilson interval (imported here: it loads torch)

    p1, p2 = (a + b) / n, (a + c) / n
    z = _z(conf)
    l1, u1 = wilson_interval(a + b, n, z)
    l2, u2 = wilson_interval(a + c, n, z)
    den = float(a + b) * (c + d) * (a + c) * (b + d)
    if den == 0:
        phi = 0.0
    else:
        num = float(a) * d - float(b) * c
        if num > 0:
            num = max(num - n / 2, 0.0)
        phi = num / math.sqrt(den)
    diff = p1 - p2
    delta = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    epsilon = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return (max(-1.0, diff - delta), min(1.0, diff + epsilon))


def paired_bootstrap_ci(success_a: np.ndarray, success_b: np.ndarray, cluster: np.ndarray | None = None,
                        n_resamples: int = 10_000, conf: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval for ``mean(success_a) - mean(success_b)`` over paired outcomes.

    ``success_a``, ``success_b``: boolean arrays of shape (n,), one entry per pair. Pairs are
    resampled with replacement, or, when ``cluster`` (shape (n,), e.g. the dataset image index)
    is given, whole clusters are resampled, so that the replicates of one image stay together.
    ``seed`` makes the interval reproducible. ``(nan, nan)`` when there is no pair.
    """
    sa = np.asarray(success_a, dtype=bool)
    sb = np.asarray(success_b, dtype=bool)
    if sa.shape != sb.shape or sa.ndim != 1:
        raise ValueError(f"success_a and success_b must be 1-d of equal length, got {sa.shape} and {sb.shape}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be positive, got {n_resamples}")
    n = sa.size
    if n == 0:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    d = sa.astype(np.int64) - sb.astype(np.int64)
    if cluster is None:
        # resampling pairs only changes the counts of the three kinds of pair (A only, B only,
        # concordant): a multinomial draw of those counts is the same bootstrap, in O(1) memory
        probs = np.array([(d == 1).sum(), (d == -1).sum(), (d == 0).sum()], dtype=float) / n
        counts = rng.multinomial(n, probs, size=n_resamples)
        diffs = (counts[:, 0] - counts[:, 1]) / n
    else:
        cl = np.asarray(cluster)
        if cl.shape != sa.shape:
            raise ValueError(f"cluster must have shape {sa.shape}, got {cl.shape}")
        _, inv = np.unique(cl, return_inverse=True)
        k = int(inv.max()) + 1
        dsum = np.bincount(inv, weights=d, minlength=k)
        nsum = np.bincount(inv, minlength=k).astype(float)
        diffs = np.empty(n_resamples)
        both = np.stack([dsum, nsum], 1)
        for s, w in _cluster_weights(k, n_resamples, seed):
            num, den = (w @ both).T  # one pass over the counts; sums of integers: exact in float64
            diffs[s:s + len(w)] = num / den
    lo, hi = np.quantile(diffs, [(1 - conf) / 2, (1 + conf) / 2])
    return (float(lo), float(hi))


def _cluster_weights(k: int, n_resamples: int, seed: int) -> Iterable[tuple[int, np.ndarray]]:
    """The cluster bootstrap's resampling counts, ``n_resamples`` multinomial draws of ``k``
    clusters from ``default_rng(seed)``, as (first row, block) pairs of at most 2,000,000 counts
    (bounded memory). The draws depend only on (k, n_resamples, seed), and a claims table asks
    for the same few dozen times (k = the images of a comparison), so small ones are kept
    (:func:`_cached_cluster_weights`): drawing 10,000 x 1,000 counts takes about half a second.
    Larger ones are drawn block by block as they are used, never held whole."""
    if k * n_resamples <= 20_000_000:
        return _cached_cluster_weights(k, n_resamples, seed)
    return _draw_cluster_weights(k, n_resamples, seed)


def _draw_cluster_weights(k: int, n_resamples: int, seed: int):
    rng = np.random.default_rng(seed)
    block = max(1, 2_000_000 // k)
    for s in range(0, n_resamples, block):
        yield s, rng.multinomial(k, np.full(k, 1.0 / k), size=min(block, n_resamples - s))


@functools.lru_cache(maxsize=4)
def _cached_cluster_weights(k: int, n_resamples: int, seed: int) -> list[tuple[int, np.ndarray]]:
    out = []
    for s, w in _draw_cluster_weights(k, n_resamples, seed):
        w = w.astype(np.uint16 if k < 2 ** 16 else np.int64)  # counts never exceed k: 20 MB for 10,000 x 1,000
        w.flags.writeable = False
        out.append((s, w))
    return out


def holm(pvalues: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm's step-down adjustment of a family of p-values (same order as given).

    ``p_holm[(i)] = max_{j <= i} min(1, (m - j + 1) p_(j))`` over the sorted p-values, so the
    adjusted values are monotone in the raw ones and capped at 1. NaN entries are left NaN and do
    not count in the family size ``m``.
    """
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    ok = ~np.isnan(p)
    m = int(ok.sum())
    if m == 0:
        return out
    idx = np.flatnonzero(ok)
    order = idx[np.argsort(p[idx], kind="stable")]
    adj = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out[order] = np.maximum.accumulate(adj)
    return out


def verdict(diff: float, p_adjusted: float, alpha: float = ALPHA) -> str:
    """``'a_better'`` / ``'b_better'`` when the (Holm-adjusted) p is below ``alpha``, by the sign of
    ``diff = asr_a - asr_b``; otherwise ``'no_difference'`` (also for NaN p)."""
    if not (p_adjusted < alpha) or diff == 0 or math.isnan(diff):
        return "no_difference"
    return "a_better" if diff > 0 else "b_better"


@dataclass
class PairedResult:
    """One paired comparison (pooled over strata when there are several). Rates in [0, 1]."""

    n_pairs: int
    n_both: int
    n_a_only: int
    n_b_only: int
    n_neither: int
    asr_a: float
    asr_b: float
    diff: float
    diff_ci_low: float
    diff_ci_high: float
    p_mcnemar: float
    method: str
    n_strata: int
    diff_rep_min: float
    diff_rep_max: float
    diff_rep_sd: float

    def as_dict(self) -> dict:
        return asdict(self)


def table_2x2(success_a: np.ndarray, success_b: np.ndarray) -> tuple[int, int, int, int]:
    """``(a, b, c, d)`` = (both, A only, B only, neither) of two boolean arrays of shape (n,)."""
    sa = np.asarray(success_a, dtype=bool)
    sb = np.asarray(success_b, dtype=bool)
    return (int((sa & sb).sum()), int((sa & ~sb).sum()), int((~sa & sb).sum()), int((~sa & ~sb).sum()))


def stratified_paired_test(tables: Sequence[Sequence[int]]) -> tuple[float, float, np.ndarray]:
    """Exact stratified (Cochran–Mantel–Haenszel) test for paired binary data over K strata.

    ``tables``: shape (K, 4), one ``(a, b, c, d)`` per stratum (surrogate replicate). With each
    matched pair as its own CMH stratum, the CMH statistic reduces to McNemar's on the pooled
    discordant counts; this function uses its exact conditional form: under the null each
    discordant pair favours A with probability 1/2 independently, so ``sum_k b_k`` is
    ``Binomial(sum_k (b_k + c_k), 1/2)`` and the p-value is :func:`mcnemar_exact` on the sums.
    Returns ``(pooled diff, p, per-stratum diffs of shape (K,))``; the pooled difference weighs
    strata by their number of pairs.
    """
    t = np.asarray(tables, dtype=np.int64).reshape(-1, 4)
    n_k = t.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        per = np.where(n_k > 0, (t[:, 1] - t[:, 2]) / np.maximum(n_k, 1), np.nan)
    n = int(n_k.sum())
    pooled = float((t[:, 1].sum() - t[:, 2].sum()) / n) if n else math.nan
    return pooled, mcnemar_exact(int(t[:, 1].sum()), int(t[:, 2].sum())), per


def compare_paired(success_a: np.ndarray, success_b: np.ndarray, strata: np.ndarray | None = None,
                   cluster: np.ndarray | None = None, method: str = "newcombe", conf: float = 0.95,
                   n_resamples: int = 10_000, seed: int = 0) -> PairedResult:
    """Compare A and B on paired boolean outcomes of shape (n,) (one entry per image, or per
    (replicate, image) when ``strata`` gives each pair's replicate).

    - p-value: exact McNemar; with strata, the exact stratified test of :func:`stratified_paired_test`.
    - interval (``conf``): ``method="newcombe"`` (Newcombe 1998 method 10 on the pooled 2×2
      table; it treats the pairs of different replicates as independent) or
      ``method="bootstrap"`` (seeded percentile bootstrap, ``n_resamples`` draws, resampling
      ``cluster``s, e.g. image indices, so each image's replicates stay together).
    - spread: min, max and sd (ddof=1; NaN for one stratum) of the per-stratum differences.
    """
    if method not in ("newcombe", "bootstrap"):
        raise ValueError(f"method must be 'newcombe' or 'bootstrap', got {method!r}")
    sa = np.asarray(success_a, dtype=bool)
    sb = np.asarray(success_b, dtype=bool)
    if strata is None:
        strata = np.zeros(sa.shape, dtype=np.int64)
    strata = np.asarray(strata)
    levels = np.unique(strata)
    tables = [table_2x2(sa[strata == s], sb[strata == s]) for s in levels]
    a, b, c, d = (int(v) for v in np.sum(tables, axis=0)) if tables else (0, 0, 0, 0)
    n = a + b + c + d
    pooled, p, per = stratified_paired_test(tables) if tables else (math.nan, 1.0, np.array([]))
    if method == "newcombe":
        lo, hi = newcombe_paired_ci(a, b, c, d, conf)
    else:
        lo, hi = paired_bootstrap_ci(sa, sb, cluster, n_resamples, conf, seed)
    per = per[~np.isnan(per)]
    return PairedResult(
        n_pairs=n, n_both=a, n_a_only=b, n_b_only=c, n_neither=d,
        asr_a=(a + b) / n if n else math.nan, asr_b=(a + c) / n if n else math.nan,
        diff=pooled, diff_ci_low=lo, diff_ci_high=hi, p_mcnemar=p, method=method, n_strata=len(levels) or 1,
        diff_rep_min=float(per.min()) if per.size else math.nan,
        diff_rep_max=float(per.max()) if per.size else math.nan,
        diff_rep_sd=float(per.std(ddof=1)) if per.size > 1 else math.nan,
    )


def summarize_blackbox(table: pd.DataFrame, eps: Sequence[float] = ()) -> pd.DataFrame:
    """Per (victim, norm, budget) over clean-correct images: n, median/q25/q75 of the minimal L2
    and L∞ found (inf = none found), mean queries used, and for each ε the fraction of images with
    min_linf ≤ ε (the HSJA ASR at that L∞ ε; meaningful for the L∞ variant)."""
    rows = []
    for (v, nm, b), g in table.groupby(["victim", "norm", "budget"], sort=True):
        g = g[g["clean_correct"]]
        r = {"victim": v, "norm": nm, "budget": int(b), "n_clean_correct": len(g),
             "mean_queries": float(g["queries_used"].mean()) if len(g) else float("nan")}
        for k in ("l2", "linf"):
            vals = g[f"min_{k}"].to_numpy(dtype=float)
            for s, p in (("q25", .25), ("median", .5), ("q75", .75)):
                r[f"{s}_min_{k}"] = float(np.quantile(vals, p, method="inverted_cdf")) if len(vals) else float("nan")
        for e in eps:
            r[f"asr_linf_{e:.4f}"] = float((g["min_linf"] <= e + 1e-9).mean()) if len(g) else float("nan")
        rows.append(r)
    return pd.DataFrame(rows)
