"""SAT: similarity of models by adversarial attack transferability (Hwang et al., "Similarity of
neural architectures using adversarial attack transferability").

For models A and B, adversarial examples x_A (crafted on A) and x_B (crafted on B) of the same
images, and X_AB the images both classify correctly and whose own attack succeeds on each
(A(x) = B(x) = y, A(x_A) ≠ y, B(x_B) ≠ y):

    SAT(A, B) = log( max( ε_s, 100 · 1/(2|X_AB|) · Σ_{x ∈ X_AB} [ 1(A(x_B) ≠ y) + 1(B(x_A) ≠ y) ] ) )

i.e. the log of the two-way transfer rate in percent, floored at ε_s (the paper's small
constant; its value is ours: 0.1 percentage points, so log(ε_s) ≈ −2.3 and SAT ≤ log 100 ≈ 4.6).
Symmetric by construction; SAT(A, A) is not defined by the formula (the white-box rate is 100 %),
the diagonal is set to log 100. Targeted cells use "predicts the target" for ≠ y.

From a run: a model counts when it appears as a single-model surrogate and as a victim. For each
(attack, ε) the matrix is built from the cells of those single-model surrogates; the figure draws
the (attack, ε) with the most models (ties: largest ε). Hierarchical clustering uses the distance
log(100) − SAT (average linkage, scipy.cluster.hierarchy).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ...core.utils import write_table
from ..runs import joined_samples

EPS_S = 0.1
SAT_MAX = math.log(100.0)


def sat_pair(a_clean_ok, b_clean_ok, a_own_fooled, b_own_fooled, a_fooled_by_b, b_fooled_by_a,
             eps_s: float = EPS_S) -> tuple[float, int]:
    """SAT(A, B) and |X_AB| from per-image boolean arrays over the same images (see module doc)."""
    m = (np.asarray(a_clean_ok, bool) & np.asarray(b_clean_ok, bool) & np.asarray(a_own_fooled, bool)
         & np.asarray(b_own_fooled, bool))
    n = int(m.sum())
    if n == 0:
        return float("nan"), 0
    rate = 100.0 * (np.asarray(a_fooled_by_b, bool)[m].sum() + np.asarray(b_fooled_by_a, bool)[m].sum()) / (2 * n)
    return math.log(max(eps_s, rate)), n


def sat_tables(run_dir: str | Path, eps_s: float = EPS_S, write: bool = True) -> pd.DataFrame:
    """Long table (attack_label, eps, model_a, model_b, sat, n_pairs, transfer_pct) of every pair
    of models that appear as single surrogates and as victims; RUN/similarity.parquet/.csv."""
    s = joined_samples(run_dir)
    singles = s[~s["surrogate"].str.contains(r"\+", regex=True)]
    rows = []
    for (lab, eps), g in singles.groupby(["attack_label", "eps"], sort=True):
        models = sorted(set(g["surrogate"]) & set(g["victim"]))
        # per (surrogate, victim): (clean_correct, success) by image; on X_AB, where both models are
        # right on x, success (right on x, fooled on x_adv) is exactly the indicator of the formula
        tab = {}
        for (sur, vic), h in g.groupby(["surrogate", "victim"]):
            h = h.set_index("index").sort_index()
            tab[(sur, vic)] = (h["clean_correct"].astype(bool), h["success"].astype(bool))
        for i, a in enumerate(models):
            for b in models[i + 1:]:
                need = [(a, a), (b, b), (b, a), (a, b)]
                if not all(k in tab for k in need):
                    continue
                idx = tab[(a, a)][0].index
                cc_a, own_a = tab[(a, a)][0].reindex(idx), tab[(a, a)][1].reindex(idx)
                cc_b, own_b = tab[(b, b)][0].reindex(idx), tab[(b, b)][1].reindex(idx)
                a_by_b = tab[(b, a)][1].reindex(idx, fill_value=False)
                b_by_a = tab[(a, b)][1].reindex(idx, fill_value=False)
                sat, n = sat_pair(cc_a, cc_b, own_a, own_b, a_by_b, b_by_a, eps_s)
                rows.append({"attack_label": lab, "eps": float(eps), "model_a": a, "model_b": b, "sat": sat,
                             "n_pairs": n, "transfer_pct": math.exp(sat) if n else float("nan")})
    out = pd.DataFrame(rows, columns=["attack_label", "eps", "model_a", "model_b", "sat", "n_pairs", "transfer_pct"])
    if write:
        write_table(out, run_dir, "similarity")
    return out


def sat_matrix(pairs: pd.DataFrame) -> pd.DataFrame:
    """Symmetric SAT matrix of one (attack, ε) from :func:`sat_tables` rows; diagonal log 100."""
    models = sorted(set(pairs["model_a"]) | set(pairs["model_b"]))
    m = pd.DataFrame(np.nan, index=models, columns=models)
    for r in pairs.itertuples():
        m.loc[r.model_a, r.model_b] = m.loc[r.model_b, r.model_a] = r.sat
    m.attrs["n_pairs"] = {(r.model_a, r.model_b): int(r.n_pairs) for r in pairs.itertuples()}
    for k in models:
        m.loc[k, k] = SAT_MAX
    return m


def plot_similarity(run_dir: str | Path, pairs: pd.DataFrame | None = None,
                    formats: tuple[str, ...] = ("png", "pdf")) -> list[Path]:
    """RUN/figures/sat_similarity.* (heatmap, SAT and transfer % in each cell) and
    sat_dendrogram.* (average-linkage clustering on log 100 − SAT); needs ≥ 2 models."""
    from ..plots import pyplot

    plt = pyplot()

    from ..plots import save_figure
    from scipy.cluster.hierarchy import dendrogram, linkage
    from scipy.spatial.distance import squareform

    if pairs is None:
        pairs = sat_tables(run_dir, write=False)
    pairs = pairs.dropna(subset=["sat"])
    if not len(pairs):
        return []
    counts = pairs.groupby(["attack_label", "eps"]).apply(
        lambda g: len(set(g.model_a) | set(g.model_b)), include_groups=False)
    lab, eps = max(counts.index, key=lambda k: (counts[k], k[1]))
    sel = pairs[(pairs.attack_label == lab) & (pairs.eps == eps)]
    m = sat_matrix(sel)
    models = list(m.index)
    k = len(models)
    title = f"SAT · {lab} · L∞ ε={eps * 255:.0f}/255"
    out_dir = Path(run_dir) / "figures"
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    fig, ax = plt.subplots(figsize=(2.2 + 0.9 * k, 1.8 + 0.8 * k))
    vals = m.to_numpy(float)
    off = vals[~np.eye(k, dtype=bool) & np.isfinite(vals)]
    # colour range: from the smallest SAT shown (rounded down to 0.5) to the maximum, so the
    # differences between pairs are visible; the numbers in the cells stay absolute
    vmin = min(SAT_MAX - 0.5, math.floor(2 * off.min()) / 2) if off.size else math.log(EPS_S)
    im = ax.imshow(vals, cmap="magma", vmin=vmin, vmax=SAT_MAX)
    for i in range(k):
        for j in range(k):
            v = m.iat[i, j]
            if np.isfinite(v):
                npair = m.attrs["n_pairs"].get((models[i], models[j])) or m.attrs["n_pairs"].get((models[j], models[i]))
                pct = "≤0.1%" if v <= math.log(EPS_S) + 1e-9 else f"{math.exp(v):.1f}%"
                txt = "—" if i == j else f"{v:.2f}\n{pct}\nn={npair}"
                dark = (v - vmin) / (SAT_MAX - vmin) < 0.55
                ax.text(j, i, txt, ha="center", va="center", fontsize=8 if k <= 6 else 7,
                        color="white" if dark else "black", linespacing=1.1)
    ax.set_xticks(range(k), models, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(k), models, fontsize=8)
    cb = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    cb.set_label("SAT = log(two-way transfer %)", fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    written += save_figure(fig, out_dir, "sat_similarity", formats)
    if k >= 2:
        dist = (SAT_MAX - m).to_numpy(float)
        dist = np.where(np.isfinite(dist), dist, SAT_MAX - math.log(EPS_S))   # missing pair: most distant
        np.fill_diagonal(dist, 0.0)
        dist = np.clip((dist + dist.T) / 2, 0, None)
        Z = linkage(squareform(dist, checks=False), method="average")
        fig, ax = plt.subplots(figsize=(2.5 + 0.7 * k, 3.6))
        dendrogram(Z, labels=models, ax=ax, leaf_rotation=45, color_threshold=0)
        ax.set_ylabel("log(100) − SAT (average linkage)", fontsize=8)
        ax.set_title(f"clustering · {title}", fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
        fig.tight_layout()
        written += save_figure(fig, out_dir, "sat_dendrogram", formats)
    return written


__all__ = ["sat_pair", "sat_tables", "sat_matrix", "plot_similarity", "EPS_S"]
