"""Worst case over attacks, and ASR-vs-ε curves, from a run's per-image tables.

Exposure of a victim V at ε (:func:`exposure_table`): over the transfer cells S_ε of the run at
that ε (every surrogate × attack; cells where V is one of the surrogates are left out unless
``include_whitebox``), image i is exposed if some cell fools V on it:

    fooled_any(V, i, ε) = OR_{c ∈ S_ε} success(c, V, i),
    robust accuracy against the union = #{i : V right on x_i and not fooled_any} / n,
    ASR of the union = #{i : fooled_any} / #{i : V right on x_i}  (≥ every member's ASR),

and its minimal distortion (where measured, see :mod:`.distortion`) is the minimum over every
transfer cell of the run, at any ε: min_c min_linf(c, V, i) (inf = no direction fools V within
the cap).

ASR vs ε (:func:`asr_eps_curve`): from one craft at ε₀ the scaled-direction estimate is
ASR(ε') = #{clean-correct i : min_linf_i ≤ ε'} / #clean-correct, which needs no new crafting.
For ε' > ε₀ it extrapolates along the same direction (scales t > 1 leave the crafted ε₀-ball), so
it is a lower bound on what a fresh craft at ε' would do only in spirit, not in guarantee.
Where the run holds cells of the same (surrogate, attack) at several ε, the crafted points
(their ASR) are drawn next to it (:func:`plot_asr_vs_eps`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ...core.utils import atomic_path
from ..runs import joined_samples, run_context
from .distortion import success_curve


def exposure_table(run_dir: str | Path, include_whitebox: bool = False, write: bool = True
                   ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-victim table, per-(victim, image) table); see the module docstring.

    Per victim and ε: n, n_clean_correct, n_cells, asr_union, robust_acc_union, best_member
    (surrogate/attack of the highest-ASR cell), asr_best_member, median_min_linf and
    median_min_l2 (over clean-correct images, minimum over every transfer cell of the run at any ε;
    NaN where distortion was not measured). Written to RUN/exposure.parquet/.csv when ``write``.
    """
    s = joined_samples(run_dir)
    if not include_whitebox:
        s = s[~s["is_whitebox"].astype(bool)]
    has_min = "min_linf" in s.columns and s["min_linf"].notna().any()
    per_img = []
    rows = []
    for v, sv in s.groupby("victim", sort=True):
        cc = sv.groupby("index")["clean_correct"].first()
        if has_min:
            md = sv.groupby("index")[["min_linf", "min_l2"]].min()
        for eps, se in sv.groupby("eps", sort=True):
            anyf = se.groupby("index")["success"].any().reindex(cc.index, fill_value=False)
            member = se.groupby(["surrogate", "attack_label"])["success"].sum()
            n_cc = int(cc.sum())
            best = member.idxmax() if len(member) else ("", "")
            r = {"victim": v, "eps": float(eps), "eps_str": se["eps_str"].iloc[0], "n": len(cc),
                 "n_clean_correct": n_cc, "n_cells": int(se["cell_id"].nunique()),
                 "asr_union": float(anyf.sum() / n_cc) if n_cc else float("nan"),
                 "robust_acc_union": float((cc & ~anyf).sum() / len(cc)) if len(cc) else float("nan"),
                 "best_member": f"{best[0]} / {best[1]}",
                 "asr_best_member": float(member.max() / n_cc) if n_cc and len(member) else float("nan")}
            for k in ("linf", "l2"):
                if has_min:
                    vals = md.loc[cc[cc].index, f"min_{k}"].to_numpy(dtype=float)
                    r[f"median_min_{k}"] = float(np.quantile(vals, 0.5, method="inverted_cdf")) if len(vals) else float("nan")
                else:
                    r[f"median_min_{k}"] = float("nan")
            rows.append(r)
            per_img.append(pd.DataFrame({"victim": v, "eps": float(eps), "index": cc.index,
                                         "clean_correct": cc.to_numpy(), "fooled_any": anyf.to_numpy(),
                                         **({"min_linf": md.loc[cc.index, "min_linf"].to_numpy(),
                                             "min_l2": md.loc[cc.index, "min_l2"].to_numpy()} if has_min else {})}))
    table = pd.DataFrame(rows)
    images = pd.concat(per_img, ignore_index=True) if per_img else pd.DataFrame()
    if write:
        with atomic_path(Path(run_dir) / "exposure.parquet") as tmp:
            table.to_parquet(tmp, index=False)
        with atomic_path(Path(run_dir) / "exposure.csv") as tmp:
            table.to_csv(tmp, index=False)
    return table, images


def asr_eps_curve(min_linf: np.ndarray, clean_correct: np.ndarray, eps_grid: np.ndarray) -> np.ndarray:
    """Scaled-direction ASR at each ε' of ``eps_grid``: fraction of clean-correct images with
    min_linf ≤ ε' (non-decreasing in ε')."""
    cc = np.asarray(clean_correct, dtype=bool)
    # 1e-6: float32 rounding of x_adv − x puts a crafted point's L∞ a hair above its ε
    return success_curve(np.asarray(min_linf, dtype=float)[cc], np.asarray(eps_grid, dtype=float) + 1e-6)



def plot_asr_vs_eps(run_dir: str | Path, eps_max: float = 16 / 255, formats: tuple[str, ...] = ("png", "pdf")
                    ) -> list[Path]:
    """One figure per (surrogate, attack): ASR (%) against L∞ ε (in /255) for every victim
    (colours). Solid line: the scaled-direction estimate from the craft at the largest ε of that
    (surrogate, attack); markers: the ASR crafted at each ε in the run. Needs measured minimal
    distortion (:func:`advtransfer.analysis.distortion.measure_run`). Saved as
    RUN/figures/asr_eps_<surrogate>_<attack>.png/.pdf; returns the paths."""
    from ..plots import pyplot

    plt = pyplot()

    from ..plots import save_figure
    from matplotlib.lines import Line2D

    res, _ = run_context(run_dir)
    s = joined_samples(run_dir)
    if "min_linf" not in s.columns:
        return []
    s = s[s["min_linf"].notna() | s["queries"].notna()] if "queries" in s.columns else s
    out_dir = Path(run_dir) / "figures"
    out_dir.mkdir(parents=True, exist_ok=True)
    grid = np.linspace(0, eps_max, 129)
    written: list[Path] = []
    for (sur, lab), sg in s.groupby(["surrogate", "attack_label"], sort=True):
        eps0 = float(sg["eps"].max())
        base = sg[sg["eps"] == eps0]
        victims = sorted(base["victim"].unique())
        fig, ax = plt.subplots(figsize=(8.6, 4.2))
        colors = plt.get_cmap("tab10")
        for k, v in enumerate(victims):
            bv = base[base["victim"] == v]
            wb = bool(bv["is_whitebox"].iloc[0])
            curve = asr_eps_curve(bv["min_linf"].to_numpy(), bv["clean_correct"].to_numpy(), grid)
            ax.plot(grid * 255, curve * 100, color=colors(k % 10), lw=1.8, ls=":" if wb else "-",
                    label=f"{v}{' (white-box)' if wb else ''}")
            pts = res[(res.surrogate == sur) & (res.attack_label == lab) & (res.victim == v)]
            ax.plot(pts["eps"] * 255, pts["asr"] * 100, "o", color=colors(k % 10), ms=6, mec="black", mew=0.6)
        handles, labels = ax.get_legend_handles_labels()
        # the key in black/white: every tab10 colour (grey included) may be a victim's
        handles += [Line2D([], [], color="black", lw=1.8),
                    Line2D([], [], ls="", marker="o", mfc="white", mec="black")]
        labels += [f"line: scaled direction of the ε={eps0 * 255:.0f}/255 craft",
                   "marker: crafted at that ε (results table)"]
        ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        ax.set_xlabel("L∞ ε (×1/255)")
        ax.set_ylabel("ASR on clean-correct images (%)")
        ax.set_xlim(0, eps_max * 255)
        ax.set_ylim(-2, 102)
        ax.axvline(eps0 * 255, color="gray", lw=0.6, ls="--")
        ax.grid(alpha=0.3)
        n = int(res["n"].iloc[0])
        ax.set_title(f"ASR vs ε · surrogate {sur} · {lab} (n={n})", fontsize=9)
        fig.tight_layout()
        written += save_figure(fig, out_dir, f"asr_eps_{sur}_{lab}", formats)
    return written


__all__ = ["exposure_table", "asr_eps_curve", "plot_asr_vs_eps"]
