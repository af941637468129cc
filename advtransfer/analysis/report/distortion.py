"""Report sections for the outputs of ``advtransfer distortion`` (issue #10, "distortion at the centre").

Registered with :func:`advtransfer.analysis.report.base.register_section` when this module is imported
(``report/core.py`` imports it at its end). Each section reads one output of the distortion command
from the run folder and returns ``None`` when that file is absent, so a run without
``advtransfer distortion`` gets the core report only:

- :func:`section_min_distortion`: ``distortion.parquet``; per attack × ε a surrogate × victim
  table of the median minimal L∞ along the transfer direction, in /255, with quartiles;
- :func:`section_asr_eps`: ``figures/asr_eps_*.png`` plus one sentence per figure comparing the
  scaled-direction ASR with the ASR crafted at each ε of the run;
- :func:`section_blackbox`: ``blackbox.parquet``; HopSkipJump per victim and budget, and per victim
  the ratio (best transfer source's median minimal L2) / (HopSkipJump's median minimal L2) on the
  same images;
- :func:`section_exposure`: ``exposure.parquet``; union over transfer attacks per victim and ε;
- :func:`section_fit`: ``fit.parquet``; FiT's pick against the best source in hindsight and a random pick;
- :func:`section_similarity`: ``similarity.parquet`` and ``figures/sat_*.png``.

Distances are per image, pixels in [0, 1]; L∞ is shown ×255 (so 8 reads 8/255), L2 as is.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...core.errors import UserError
from ..plots import slug
from ..measures.similarity import sat_matrix
from ..runs import joined_samples, read_table
from ..stats import summarize_blackbox
from .base import (Block, Figure, Raw, ReportContext, Section, Table, html_escape, matrix_table, pct, register_section,
                   signed, tex_name)

INF = "∞"
LINF_TOL = 1e-6    # float32 rounding of x_adv − x; far below the search's 1/2040 resolution


def _num(v: float, digits: int = 2, scale: float = 1.0) -> str:
    """``v·scale`` with ``digits`` decimals; ∞ for inf, n/a for NaN."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if math.isinf(v):
        return INF
    return f"{v * scale:.{digits}f}"


def _mq(med: float, lo: float, hi: float, digits: int = 2, scale: float = 1.0) -> str:
    """``median [q25, q75]``."""
    return f"{_num(med, digits, scale)} [{_num(lo, digits, scale)}, {_num(hi, digits, scale)}]"


def _median(v) -> float:
    """Inverted-CDF median (an order statistic, so inf survives), NaN when empty."""
    v = np.asarray(v, dtype=float)
    return float(np.quantile(v, 0.5, method="inverted_cdf")) if v.size else float("nan")


def _read(ctx: ReportContext, name: str) -> pd.DataFrame | None:
    df = read_table(ctx.run_dir / name, "advtransfer distortion RUN")
    return df if df is not None and len(df) else None


def _eps255(eps: float) -> str:
    return f"{eps * 255:g}/255"


def _samples(ctx: ReportContext) -> pd.DataFrame:
    """Per-image rows with measured minimal distortion, joined with the cell fields."""
    try:
        s = joined_samples(ctx.run_dir)
    except UserError:          # a run without per-image tables: no sentences, the tables still show
        return pd.DataFrame(columns=["cell_id", "victim", "index", "is_whitebox", "min_linf", "min_l2"])
    if "min_linf" not in s.columns:
        return s.iloc[0:0]
    return s[s["queries"].notna()] if "queries" in s.columns else s


# --- (a) minimal distortion along the transfer direction ----------------------------------------
@register_section
def section_min_distortion(ctx: ReportContext) -> Section | None:
    d = _read(ctx, "distortion.parquet")
    if d is None:
        return None
    blocks: list[Block] = [
        "Minimal distortion along the transfer direction: each crafted perturbation δ = x_adv − x is scaled, "
        "x(t) = clip(x + t·δ, 0, 1), and the smallest scale t* that fools the victim is found by a scan for the "
        "first crossing (every t = 1/4, 2/4, ... up to the cap) and bisection; the table gives ‖x(t*) − x‖∞ in /255 "
        "over the victim's clean-correct images, as median [q25, q75]. ∞: more than that share of images is not "
        "fooled up to the largest scale tried (4× by default). Smaller means the direction transfers more "
        "easily. White-box cells are marked †."]
    if "frac_upper_bound" in d.columns and d["n_upper_bound"].notna().any():
        m = d[d["n_upper_bound"].notna()]
        n_ub, n_cc = int(m["n_upper_bound"].sum()), int(m["n_clean_correct"].sum())
        worst = m.loc[m["frac_upper_bound"].idxmax()] if m["frac_upper_bound"].notna().any() else None
        blocks.append(
            f"Upper bounds: on {n_ub:,} of {n_cc:,} clean-correct (image, cell, victim) minima "
            f"({pct(n_ub / n_cc) + '%' if n_cc else 'n/a'}) the scan saw the victim fooled and then not fooled at a "
            "larger scale: the ray is not monotone and t* is only an upper bound there (a conservative flag: the "
            "turn back may lie above t*, where it does not move the minimum)"
            + (f" (most in one row: {pct(float(worst['frac_upper_bound']))}%, {worst['surrogate']} → "
               f"{worst['victim']}, {worst['attack_label']} at {worst['eps_str']})" if worst is not None and n_ub else "")
            + ". The other minima agree with a ray that stays fooled once fooled; a fooled island narrower than the "
            "scan step can still go unseen.")
    for (lab, eps), sub in d.groupby(["attack_label", "eps"], sort=True):
        eps_str = str(sub["eps_str"].iloc[0])
        blocks.append(matrix_table(
            sub, _min_linf_cell,
            f"{lab} · crafted at L∞ ε = {eps_str}: median minimal L∞ ×255 [q25, q75], surrogate × victim",
            f"min_linf_{lab}_eps{eps_str}"))
    return Section("Minimal distortion along the transfer direction", blocks, "min-distortion")


def _min_linf_cell(g: pd.DataFrame) -> str:
    """One (surrogate, victim) row: median minimal L∞ ×255 [q25, q75], † when white-box."""
    r = g.iloc[0]
    wb = " †" if bool(r["is_whitebox"]) else ""
    return _mq(r["median_min_linf"], r["q25_min_linf"], r["q75_min_linf"], 1, 255) + wb


# --- (b) ASR vs ε ---------------------------------------------------------------------------------
def asr_eps_sentences(ctx: ReportContext) -> dict[tuple[str, str], str]:
    """Per (surrogate, attack): one sentence comparing the scaled-direction ASR (from the craft at
    the largest ε) with the crafted ASR at each ε of the run, averaged over the transfer victims."""
    s = _samples(ctx)
    res = ctx.results
    out: dict[tuple[str, str], str] = {}
    if not len(s):
        return out
    for (sur, lab), sg in s.groupby(["surrogate", "attack_label"], sort=True):
        eps0 = float(sg["eps"].max())
        base = sg[(sg["eps"] == eps0) & ~sg["is_whitebox"].astype(bool)]
        victims = sorted(base["victim"].unique())
        crafted = res[(res["surrogate"] == sur) & (res["attack_label"] == lab) & ~res["is_whitebox"].astype(bool)]
        parts = []
        for eps in sorted(crafted["eps"].unique()):
            diffs, sc_all, cr_all = [], [], []
            for v in victims:
                bv = base[(base["victim"] == v) & base["clean_correct"].astype(bool)]
                cv = crafted[(crafted["victim"] == v) & (crafted["eps"] == eps)]
                if bv.empty or cv.empty:
                    continue
                sc = float((bv["min_linf"] <= eps + LINF_TOL).mean())
                k, n = int(cv["n_success"].sum()), int(cv["n_clean_correct"].sum())
                if not n:
                    continue
                cr = k / n
                sc_all.append(sc)
                cr_all.append(cr)
                diffs.append(sc - cr)
            if not diffs:
                continue
            e = _eps255(float(eps))
            if abs(float(eps) - eps0) < 1e-12:
                parts.append(f"at {e} (the craft itself) the curve gives {pct(np.mean(sc_all))}% against "
                             f"{pct(np.mean(cr_all))}% crafted (equal but for images fooled only beyond scale 1 "
                             "where clipping kept the L∞ within ε)")
            else:
                way = "scaling down" if eps < eps0 else "scaling up"
                parts.append(f"at {e}, {way} the {_eps255(eps0)} direction gives {pct(np.mean(sc_all))}% against "
                             f"{pct(np.mean(cr_all))}% crafted at {e} ({_signed_pts(np.mean(diffs))} points; "
                             f"{_signed_pts(min(diffs))} to {_signed_pts(max(diffs))} across victims)")
        if parts:
            out[(str(sur), str(lab))] = (f"Surrogate {sur}, {lab}, mean ASR over {len(victims)} transfer victims: "
                                         + "; ".join(parts) + ".")
    return out


def _signed_pts(v: float) -> str:

    return signed(100 * v)


@register_section
def section_asr_eps(ctx: ReportContext) -> Section | None:
    figs = sorted((ctx.run_dir / "figures").glob("asr_eps_*.png"))
    if not figs:
        return None
    blocks: list[Block] = [
        "ASR against L∞ ε without new crafting: the line is the share of clean-correct images whose minimal "
        "distortion along the direction crafted at the largest ε is at most ε (scaling that direction); "
        "the markers are the ASR crafted at each ε of the run. Where the line lies below the marker, crafting "
        "at that ε finds a better direction than scaling; above it, the larger craft's direction is the "
        "stronger one."]
    sentences = asr_eps_sentences(ctx)
    by_stem = {slug(f"asr_eps_{sur}_{lab}"): (sur, lab, txt) for (sur, lab), txt in sentences.items()}
    for p in figs:
        sur, lab, txt = by_stem.get(p.stem, ("", "", ""))
        blocks.append(Figure(ctx.rel(p), f"ASR vs ε · surrogate {sur} · {lab}" if sur else p.stem.replace("_", " ")))
        if txt:
            blocks.append(txt)
    return Section("ASR vs ε", blocks, "asr-eps")


# --- (c) black-box yardstick -------------------------------------------------------------------------
def blackbox_sentences(ctx: ReportContext, bb: pd.DataFrame) -> list[str]:
    """Per victim: best transfer source's median minimal L2 / HopSkipJump's median minimal L2 at
    each budget, on the same images (the victim's clean-correct images among those HopSkipJump
    attacked) where the run measured them."""
    s = _samples(ctx)
    s = s[~s["is_whitebox"].astype(bool)] if len(s) else s
    norm = "l2" if (bb["norm"] == "l2").any() else str(bb["norm"].iloc[0])
    b = bb[bb["norm"] == norm]
    out = []
    for v, bv in b.groupby("victim", sort=True):
        budgets = sorted(bv["budget"].unique())
        imgs = np.sort(bv[bv["clean_correct"].astype(bool)]["index"].unique())
        sv = s[s["victim"] == v] if len(s) else s
        if not len(sv) or not len(imgs):
            continue
        same = sv[sv["index"].isin(imgs)]
        where = f"the {len(imgs)} images of the {bv['index'].nunique()} HopSkipJump attacked that {v} classifies correctly"
        if same.empty:   # no measured transfer distortion on those images: fall back to all clean-correct ones
            same = sv[sv["clean_correct"].astype(bool)]
            where = f"not the same images: {same['index'].nunique()} clean-correct images of the run for transfer"
        per_cell = same.groupby(["surrogate", "attack_label", "eps"])["min_l2"].apply(_median)
        if per_cell.empty:
            continue
        (sur, lab, eps), best = per_cell.idxmin(), float(per_cell.min())
        src = f"{sur} / {lab} at {_eps255(float(eps))}"
        if math.isinf(best):
            out.append(f"{v}: no single transfer source fools more than half of {where} within the largest scale "
                       f"tried, so its median minimal L2 is ∞; HopSkipJump ({norm}) reaches a median "
                       + ", ".join(f"{_num(_median(bv[(bv.budget == q) & bv.clean_correct].min_l2), 2)} with {q:,} queries"
                                   for q in budgets) + ".")
            continue
        parts = []
        for q in budgets:
            h = _median(bv[(bv["budget"] == q) & bv["clean_correct"].astype(bool) & bv["index"].isin(imgs)]["min_l2"])
            if math.isnan(h) or math.isinf(h) or h <= 0:
                parts.append(f"{_num(h)} with {q:,} queries (no ratio)")
            else:
                r = best / h
                how = f"{r:.2g}× as much" + (", i.e. less" if r < 1 else "")
                parts.append(f"{h:.2f} with {q:,} queries (transfer needs {how})")
        out.append(f"{v}: the best transfer direction ({src}) needs a median minimal L2 of {best:.2f}; "
                   "HopSkipJump needs " + " and ".join(parts) + f". Medians over {where}.")
    return out


@register_section
def section_blackbox(ctx: ReportContext) -> Section | None:
    bb = _read(ctx, "blackbox.parquet")
    if bb is None:
        return None
    summ = summarize_blackbox(bb)
    n_img = int(bb["index"].nunique())
    blocks: list[Block] = [
        f"Black-box yardstick: HopSkipJump (decision-based, no surrogate) on the run's first {n_img} images, with "
        "an exact budget of queries per image; the minimal L2 and L∞ distortion among the adversarial points it "
        "found within each budget, over the victim's clean-correct images, as median [q25, q75] (L∞ ×255). "
        "The L2 variant's L∞ column is the L∞ of its L2-minimal points, an upper bound on the minimal L∞."]
    rows = [[r.victim, r.norm, f"{int(r.budget):,}", str(int(r.n_clean_correct)),
             _mq(r.median_min_l2, r.q25_min_l2, r.q75_min_l2, 2),
             _mq(r.median_min_linf, r.q25_min_linf, r.q75_min_linf, 1, 255),
             _num(r.mean_queries, 0)] for r in summ.itertuples()]
    blocks.append(Table(["victim", "variant", "budget", "clean-correct", "min L2", "min L∞ ×255", "mean queries"],
                        rows, "HopSkipJump: minimal distortion found within the budget, median [q25, q75]",
                        tex="blackbox"))
    sent = blackbox_sentences(ctx, bb)
    if sent:
        blocks.append("How much more distortion transfer needs than the black-box attack, per victim (ratio of "
                      "medians of minimal L2; the best source is the surrogate × attack × ε with the smallest "
                      "median on those images; white-box cells left out):")
        blocks.append(Raw("\n".join(f"- {t}" for t in sent),
                          "<ul>\n" + "\n".join(f"<li>{html_escape(t)}</li>" for t in sent) + "\n</ul>"))
    return Section("Black-box yardstick (HopSkipJump)", blocks, "blackbox")


# --- (d) exposure ------------------------------------------------------------------------------------
@register_section
def section_exposure(ctx: ReportContext) -> Section | None:
    e = _read(ctx, "exposure.parquet")
    if e is None:
        return None
    rows = [[r.victim, str(r.eps_str), str(int(r.n_cells)), pct(r.robust_acc_union), pct(r.asr_union),
             pct(r.asr_best_member), str(r.best_member), _num(r.median_min_linf, 1, 255), _num(r.median_min_l2, 2)]
            for r in e.sort_values(["victim", "eps"]).itertuples()]
    return Section("Exposure: worst case over transfer attacks", [
        "Per victim and ε, the union of every transfer cell of the run (every surrogate × attack; cells where the "
        "victim is a surrogate are left out): an image is exposed when any cell fools the victim on it. Robust "
        "accuracy against the union = images the victim classifies correctly and no cell fools, over all images; "
        "ASR of the union over clean-correct images, next to the strongest single cell. The median minimal "
        "distortion takes, per image, the smallest over every transfer cell at any ε (L∞ ×255; ∞: more than half "
        "of the images are not fooled by any direction up to the largest scale).",
        Table(["victim", "ε", "cells", "robust acc. % (union)", "ASR % (union)", "ASR % (best cell)", "best cell",
               "median min L∞ ×255", "median min L2"], rows, "Union over transfer attacks", tex="exposure")],
        "exposure")


# --- (e) FiT ---------------------------------------------------------------------------------------------
@register_section
def section_fit(ctx: ReportContext) -> Section | None:
    f = _read(ctx, "fit.parquet")
    if f is None:
        return None
    blocks: list[Block] = [
        "FiT source selection (Maho et al., ICCV 2023) replayed on the run: with Q clean-label queries to the "
        "victim (on held-out test images), each image is attacked with the source of highest "
        "similarity / transfer-distortion score. Its ASR against the single best source in hindsight and the "
        "expected ASR of a uniformly random source (percent, clean-correct images; regret = best − FiT, points)."]
    for (eps, q), g in f.groupby(["eps", "Q"], sort=True):
        blocks.append(f"ε {g['eps_str'].iloc[0]}, Q = {int(q)}: over {len(g)} victims FiT's pick averages "
                      f"{pct(g['fit_asr'].mean())}% ASR, the best source in hindsight {pct(g['best_asr'].mean())}% "
                      f"and a random pick {pct(g['random_asr'].mean())}%; FiT beats random on "
                      f"{int((g['fit_asr'] > g['random_asr'] + 1e-12).sum())} of {len(g)} victims and matches the "
                      f"best on {int((g['fit_asr'] >= g['best_asr'] - 1e-12).sum())}.")
    rows = [[r.victim, str(r.eps_str), str(int(r.Q)), str(r.fit_source), pct(r.fit_share_mode, 0), pct(r.fit_asr),
             str(r.best_source), pct(r.best_asr), pct(r.random_asr), _num(100 * r.regret_asr, 1).replace("-", "−")]
            for r in f.sort_values(["eps", "Q", "victim"]).itertuples()]
    blocks.append(Table(["victim", "ε", "Q", "FiT's most picked source", "share of images %", "FiT ASR %",
                         "best source (hindsight)", "best ASR %", "random ASR %", "regret pts"], rows,
                        "FiT against the best source in hindsight and a random pick", tex="fit"))
    return Section("FiT source selection", blocks, "fit")


# --- (f) SAT similarity ------------------------------------------------------------------------------------
@register_section
def section_similarity(ctx: ReportContext) -> Section | None:
    sim = _read(ctx, "similarity.parquet")
    figs = [p for p in (ctx.run_dir / "figures" / "sat_similarity.png", ctx.run_dir / "figures" / "sat_dendrogram.png")
            if p.is_file()]
    if sim is None and not figs:
        return None
    blocks: list[Block] = [
        "SAT similarity (Hwang et al.) of the models that are both single-model surrogates and victims: "
        "SAT(A, B) = log of the two-way transfer rate in percent on the images both classify correctly and both "
        "own attacks fool, floored at log 0.1 ≈ −2.30; log 100 ≈ 4.61 is the most similar. The dendrogram "
        "clusters on log 100 − SAT (average linkage)."]
    if sim is not None:
        for (lab, eps), g in sim.dropna(subset=["sat"]).groupby(["attack_label", "eps"], sort=True):
            m = sat_matrix(g)
            models = list(m.index)
            rows = [[a, *("—" if a == b else _num(m.loc[a, b], 2) for b in models)] for a in models]
            blocks.append(Table(["model", *models], rows, f"SAT · {lab} · L∞ ε = {_eps255(float(eps))}",
                                tex=tex_name(f"sat_{lab}_eps{eps * 255:g}")))
    names = {"sat_similarity": "SAT matrix of the (attack, ε) with the most models (cells: SAT, two-way transfer %, "
                               "images)", "sat_dendrogram": "average-linkage clustering on log 100 − SAT"}
    blocks += [Figure(ctx.rel(p), names.get(p.stem, p.stem.replace("_", " "))) for p in figs]
    return Section("Model similarity (SAT)", blocks, "similarity")


__all__ = ["section_min_distortion", "section_asr_eps", "section_blackbox", "section_exposure", "section_fit",
           "section_similarity", "asr_eps_sentences", "blackbox_sentences"]
