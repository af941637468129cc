"""Report sections for learned attacks (generative, and universal beside them): the surrogate
compute of every cell of the run, so attacks that learn on training images and per-image attacks
are compared at stated compute; every attack's held-out transfer pooled over the victims that are
not its surrogates, with the paired difference to MI-FGSM on the same surrogate, images and
victims (:func:`held_out_transfer`); and the per-target success of targeted rows.

Registered with :func:`advtransfer.analysis.report.base.register_section` on import (``report/core.py``
imports this module at its end). Both sections return ``None`` for runs they have nothing to say
about (no generative cell; no targeted row with per-target counts).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from ...core.errors import UserError
from ...core.metrics import wilson_interval
from ...core.schema import CRAFT_FIT_IMAGES
from .. import pooling
from .base import MINUS, Block, Figure, ReportContext, Section, Table, pct, register_section, tex_name

#: the per-image attack a learned attack is compared with on the same surrogate (same targeted flag)
BASELINE_ATTACK = "mifgsm"


def _num(v, fmt: str = "{:.0f}") -> str:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return ""
    return "" if math.isnan(f) else fmt.format(f)


def _cells(df: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (its first victim row carries the cell's fields)."""
    keys = [k for k in ("cell_id",) if k in df.columns] or ["attack_label", "surrogate", "eps_str", "seed"]
    return df.drop_duplicates(keys).sort_values(["attack_kind", "attack_label", "surrogate", "eps"], kind="stable")


@register_section
def section_generative_compute(ctx: ReportContext) -> Section | None:
    """Every cell's surrogate compute beside the generative cells' training record."""
    df = ctx.results
    if "attack_kind" not in df.columns or not (df["attack_kind"] == "generative").any():
        return None
    cells = _cells(df)
    rows = []
    for _, r in cells.iterrows():
        learned = r["attack_kind"] in ("generative", "universal")
        passes = r.get("surrogate_passes", math.nan)
        if pd.isna(passes):  # rows written before the column existed
            passes = float(r["grad_evals"]) * float(r["n_craft"] if learned and not pd.isna(r.get("n_craft")) else r["n"])
        gen = r.get("gen_params", -1)
        rows.append([str(r["attack_label"]), str(r["attack_kind"]), str(r["surrogate"]), str(r["eps_str"]),
                     "yes" if bool(r["targeted"]) else "no", _num(passes), _num(r["grad_evals"]),
                     _num(r.get("n_craft")) if learned else "",
                     "" if pd.isna(gen) or int(gen) < 0 else f"{int(gen):,}",
                     _num(r.get("gen_train_s"), "{:.0f}"), _num(r["craft_s"], "{:.0f}"),
                     pct(r["craft_fooling_rate"]) if learned and not pd.isna(r.get("craft_fooling_rate")) else "",
                     _num(r.get("aux_passes")),
                     pct(r["gen_at_bound"]) if not pd.isna(r.get("gen_at_bound", math.nan)) else "",
                     pct(r["gen_universal"]) if not pd.isna(r.get("gen_universal", math.nan)) else ""])
    blocks: list[Block] = [
        "Surrogate compute of every cell, so learned and per-image attacks are compared at stated cost. "
        "A generative cell trains its generator on the first n_craft training images (never the test images "
        "it is scored on), then perturbs each test image in one forward pass, which costs no surrogate pass; "
        "a per-image attack spends its passes on each test image. *Surrogate passes* is the cell's total of "
        "forward+backward image-passes through surrogate models (a batch of B images through one model is B); "
        "*per image* divides it by the test images crafted (per-image attacks) or by the training images "
        "(learned attacks). A learned cell's cost does not grow with the number of test images it is applied "
        f"to. *Fit* is the surrogate set's fooling rate (targeted: target hit rate) on up to {CRAFT_FIT_IMAGES} of its "
        "training images. *CLIP passes*: image-passes through a CLIP image tower (PDCL), not counted as "
        "surrogate passes. *At bound*: the share of a generator's perturbations of the test images at the ε "
        "bound (L∞: entries with |δ| ≥ 0.99ε); *universal*: the share of their energy that is the same for "
        "every image (N‖mean δ‖² / Σ‖δ_i‖²). Both near 100% mean a saturated generator that has collapsed "
        "into one universal perturbation, which tanh's vanishing gradient then hardly moves.",
        Table(["attack", "kind", "surrogate", "ε", "targeted", "surrogate passes", "per image", "n_craft",
               "generator params", "generator train s", "craft s", "fit %", "CLIP passes", "at bound %",
               "universal %"], rows,
              "Surrogate compute per cell", tex="generative_compute")]
    blocks += curve_blocks(ctx)
    return Section("Generative attacks: compute", blocks, "generative-compute")


def curve_rows(df: pd.DataFrame) -> list[list[str]]:
    """One row per generative cell with a held-out curve: where it flattened (the plateau rule's
    point: updates, surrogate passes, held-out rate), where training stopped, the best rate."""
    from ..plots import gen_curves

    rows = []
    for r, c in gen_curves(df):
        p = json.loads(r["attack_params"]) if isinstance(r.get("attack_params"), str) else {}
        at = r.get("gen_plateau_at")
        flat = next((q for q in c if not pd.isna(at) and q[0] == int(at)), None)
        under = f"{p.get('patience')} points under +{100 * float(p.get('plateau_gain', 0)):g}"
        rule = f"stop after {under}" if p.get("stop") == "plateau" else f"budget ({under} read after)"
        rows.append([str(r["attack_label"]), str(r["surrogate"]), str(r["eps_str"]), str(int(r["seed"])),
                     f"{int(p.get('steps', 0)):,}", f"{int(p.get('curve_every', 0)):,}", f"{int(p.get('curve_n', 0)):,}", rule,
                     f"{int(flat[0]):,}" if flat else "not flattened", _num(flat[1], "{:,.0f}") if flat else "",
                     pct(flat[2]) if flat else "", f"{int(c[-1][0]):,}", _num(c[-1][1], "{:,.0f}"), pct(c[-1][2]),
                     pct(max(q[2] for q in c))])
    return rows


def curve_blocks(ctx: ReportContext) -> list[Block]:
    """The held-out curves of the run's generators (``curve_every`` > 0): a table of where each
    flattened and stopped, and the figures :func:`advtransfer.analysis.plots.plot_gen_curves` drew."""
    rows = curve_rows(ctx.results)
    if not rows:
        return []
    out: list[Block] = [
        "Held-out curves: while a generator trains, the surrogate set's fooling rate (targeted: target hit rate) "
        "on training images it never learns on (the curve_n after its first n_craft; not the test images it is "
        "scored on) is measured before the first update and every curve_every updates. *Flattened* is the first "
        "point after which `patience` further points never rose by `plateau_gain` over it (the plateau rule: with "
        "`stop: plateau` training stops there, otherwise it is read from the finished curve); *stopped* is the last "
        "update made. The curve's forward passes are not counted as surrogate passes (no gradient).",
        Table(["attack", "surrogate", "ε", "seed", "budget (updates)", "every", "held-out images", "rule",
               "flattened at (updates)", "passes there", "held-out % there", "stopped at", "passes", "held-out % at stop",
               "best held-out %"], rows, "Generator training: where the held-out curve flattened",
              tex="generative_curves")]
    for p in sorted((ctx.run_dir / "figures").glob("gen_curve_*.png")):
        label, _, eps = p.stem.removeprefix("gen_curve_").rpartition("_eps")
        out.append(Figure(ctx.rel(p), f"held-out curve: {label} at ε {eps.replace('-', '/')}"))
    return out


def held_out_transfer(run_dir, results: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Every attack's transfer to the held-out victims of its surrogate, pooled, beside MI-FGSM.

    One row per (surrogate, ε, attack seed, attack label) of a (surrogate, ε, seed) group that has
    a generative cell. Held-out victims are the victims of the group that are not its surrogates,
    taken only where every attack of the group was evaluated on them, so each attack is pooled
    over the same victims. ``asr`` = Σ successes / Σ clean-correct images over those victims, with
    a 95% percentile bootstrap over the test images (one resample shared by every row: 2,000
    resamples, seeded; images common to all victims are not counted as independent draws; each
    model is one trained model, so model-to-model variation is not in the interval).
    ``whitebox_asr`` pools the victims that are its surrogates (NaN if none). ``baseline`` is the
    group's MI-FGSM row of the same targeted flag (same images, victims and targets: the targets
    are drawn per image from the seed); ``diff`` = asr − its asr, with the interval of the paired
    resamples. ``surrogate_passes``: the cell's forward+backward surrogate image-passes.
    ``other_target`` (targeted rows): how often the same held-out examples land on one given class
    that is neither the image's label nor its target, averaged over those K − 2 classes — what the
    attack would score had it been asked for a random other class, the chance level its ``asr``
    must beat to show it follows its target; ``over_other`` = asr − other_target with its paired
    bootstrap interval (NaN where the labels or targets cannot be read)."""
    res = results[results["match"].fillna("none").astype(str) == "none"] if "match" in results.columns else results
    res = res.copy()
    res["seed"] = res["seed"] if "seed" in res.columns else 0
    labels_of = _labels_reader(run_dir)
    out = []
    for (sur, eps_str, sd), grp in res.groupby(["surrogate", "eps_str", "seed"], sort=True):
        if not (grp["attack_kind"] == "generative").any():
            continue
        labels = sorted(grp["attack_label"].unique())
        held = set.intersection(*[set(grp[(grp["attack_label"] == a) & ~grp["is_whitebox"].astype(bool)]["victim"])
                                  for a in labels])
        if not held:
            continue
        images = pooling.Images(run_dir, grp)
        W = pooling.boot_weights(len(images.index), seed)

        def pooled(sub: pd.DataFrame) -> tuple:
            return pooling.pooled(*images.summed(sub), W)

        stats: dict[str, tuple] = {}
        rows = {}
        for a in labels:
            sub = grp[grp["attack_label"] == a]
            first = sub.iloc[0]
            S, C = images.summed(sub[sub["victim"].isin(held)])
            ho = pooling.pooled(S, C, W)
            O = _other_target(run_dir, images, sub[sub["victim"].isin(held)], labels_of) if bool(first["targeted"]) else None
            over = {"other_target": math.nan, "over_other": math.nan, "over_other_ci_low": math.nan,
                    "over_other_ci_high": math.nan}
            if O is not None and C.sum():
                # the margin is a pooled rate itself: Σ(hits − other) / Σ clean-correct, resampled alike
                margin, lo, hi, _ = pooling.pooled(S - O, C, W)
                over = {"other_target": float(O.sum() / C.sum()), "over_other": margin,
                        "over_other_ci_low": lo, "over_other_ci_high": hi}
            wb = sub[sub["is_whitebox"].astype(bool)]
            stats[a] = ho
            passes = first.get("surrogate_passes", math.nan)
            rows[a] = {"surrogate": sur, "eps_str": eps_str, "seed": int(sd), "attack_label": a,
                       "attack": str(first["attack"]), "attack_kind": str(first["attack_kind"]),
                       "targeted": bool(first["targeted"]), "surrogate_passes": float(passes) if not pd.isna(passes) else math.nan,
                       "n_victims": len(held), "held_out": "+".join(sorted(held)),
                       "whitebox_asr": pooled(wb)[0] if len(wb) else math.nan,
                       "asr": ho[0], "asr_ci_low": ho[1], "asr_ci_high": ho[2], **over,
                       "baseline": "", "diff": math.nan, "diff_ci_low": math.nan, "diff_ci_high": math.nan}
        for a, row in rows.items():
            base = [b for b in labels if b != a and rows[b]["attack"] == BASELINE_ATTACK
                    and rows[b]["targeted"] == row["targeted"] and rows[b]["attack_kind"] != "generative"]
            if base and row["attack"] != BASELINE_ATTACK:
                b = BASELINE_ATTACK if BASELINE_ATTACK in base else base[0]
                row.update(baseline=b, **pooling.pooled_diff(stats[a], stats[b]))
            out.append(row)
    return pd.DataFrame(out)


def _labels_reader(run_dir):
    """A function giving (labels of dataset indices, class count) of the run's evaluation split, read
    lazily from the dataset the manifest names; None where it cannot be loaded."""
    cache: dict = {}

    def get():
        if "v" not in cache:
            cache["v"] = None
            try:
                from ...grid.runspec import RunSpec
                from ...run.store import RunStore

                ds = RunSpec.from_manifest(RunStore(run_dir).read_manifest()).load_split()
                cache["v"] = (np.asarray(ds.y), len(ds.classes))
            except (UserError, OSError, ValueError, KeyError):
                pass
        return cache["v"]

    return get


def _cell_targets(run_dir, cell_id: str) -> dict[int, int] | None:
    """Dataset index -> target class of a targeted cell, from its saved examples; None without them."""
    from ...run.store import RunStore

    loaded = RunStore(run_dir).load_adv(cell_id)
    if loaded is None or "target" not in loaded[0] or "index" not in loaded[0]:
        return None
    return dict(zip(loaded[0]["index"].tolist(), loaded[0]["target"].tolist()))


def _other_target(run_dir, images, rows: pd.DataFrame, labels_of) -> np.ndarray | None:
    """Per image of ``images`` (summed over ``rows``: one targeted cell, several victims):
    1[clean-correct, and x_adv classified neither as its label nor as its target] / (K − 2). None
    where the labels or the cell's targets cannot be read."""
    lab = labels_of()
    if lab is None or rows.empty:
        return None
    y_all, k = lab
    target = _cell_targets(run_dir, str(rows["cell_id"].iloc[0]))
    if k < 3 or target is None:
        return None
    out = np.zeros(len(images.index))
    for _, r in rows.iterrows():
        df = images._cell(r["cell_id"])
        df = df[df["victim"] == r["victim"]]
        idx = df["index"].to_numpy()
        t = np.array([target.get(int(i), -1) for i in idx])
        cc = df["clean_correct"].to_numpy(dtype=bool)
        pred = df["adv_pred"].to_numpy()
        pos = np.array([images.pos[int(i)] for i in idx], dtype=np.int64)
        np.add.at(out, pos, (cc & (pred != y_all[idx]) & (pred != t)) / (k - 2))
    return out


def _signed_pct(v: float) -> str:
    if v is None or pd.isna(v):
        return "n/a"
    return f"{'+' if v >= 0 else MINUS}{abs(100 * v):.1f}"


@register_section
def section_generative_transfer(ctx: ReportContext) -> Section | None:
    """Held-out transfer of every attack of a surrogate that has a generative cell, pooled over
    victims, with the paired difference to MI-FGSM (:func:`held_out_transfer`)."""
    df = ctx.results
    if "attack_kind" not in df.columns or not (df["attack_kind"] == "generative").any():
        return None
    try:
        tab = held_out_transfer(ctx.run_dir, df)
    except UserError as exc:  # per-image tables missing: say so instead of failing the report
        return Section("Generative attacks: held-out transfer", [f"Not available: {exc}"], "generative-transfer")
    if tab.empty:
        return None
    blocks: list[Block] = [
        "Each attack's success on the victims that are not its surrogates, pooled (Σ successes / Σ clean-correct "
        "images over those victims; every attack of a surrogate is pooled over the same victims), with a 95% "
        "bootstrap interval over the test images, beside MI-FGSM of the same targeted flag on the same surrogate, "
        "images, victims and targets: *vs MI-FGSM* is the paired difference in points with its interval. "
        "*Surrogate passes* is each cell's compute (a generator's training; MI-FGSM's steps on every test image). "
        "*Other target* (targeted rows): how often the same held-out examples land on one given class that is "
        "neither the label nor the requested target, averaged over those classes: the chance level a targeted "
        "attack must beat to show that it follows its target; in brackets the held-out rate minus it, in points, "
        "with its paired interval. "
        "Each surrogate and victim is one trained model: the intervals cover the images, not model-to-model "
        "variation."]
    for (sur, eps_str, sd), sub in tab.groupby(["surrogate", "eps_str", "seed"], sort=True):
        # untargeted rows first; within each, the per-image attacks, then the generators
        sub = sub.assign(_gen=sub["attack_kind"] == "generative").sort_values(
            ["targeted", "_gen", "attack_label"], kind="stable")
        rows = [[r["attack_label"], r["attack_kind"], "yes" if r["targeted"] else "no", _num(r["surrogate_passes"]),
                 pct(r["whitebox_asr"]), f"{pct(r['asr'])} [{pct(r['asr_ci_low'])}, {pct(r['asr_ci_high'])}]",
                 (f"{pct(r['other_target'])} ({_signed_pct(r['over_other'])} [{_signed_pct(r['over_other_ci_low'])}, "
                  f"{_signed_pct(r['over_other_ci_high'])}])" if r["targeted"] and not pd.isna(r["other_target"]) else ""),
                 (f"{_signed_pct(r['diff'])} [{_signed_pct(r['diff_ci_low'])}, {_signed_pct(r['diff_ci_high'])}]"
                  if r["baseline"] else "")]
                for _, r in sub.iterrows()]
        held = sub["held_out"].iloc[0].replace("+", ", ")
        blocks.append(Table(["attack", "kind", "targeted", "surrogate passes", "white-box %", "held-out % [95%]",
                             "other target % (target − other [95%])", "vs MI-FGSM, points [95%]"], rows,
                            f"surrogate {sur} · ε = {eps_str} · seed {sd}: held out {held}",
                            tex=tex_name(f"generative_transfer_{sur}_eps{eps_str}_seed{sd}")))
    return Section("Generative attacks: held-out transfer", blocks, "generative-transfer")


@register_section
def section_per_target(ctx: ReportContext) -> Section | None:
    """Targeted rows: success per target class (the row's ``asr`` pools them)."""
    df = ctx.results
    if "asr_by_target" not in df.columns:
        return None
    sel = df[df["targeted"].astype(bool) & df["asr_by_target"].fillna("").astype(str).str.startswith("{")]
    if sel.empty:
        return None
    names = _class_names(ctx)
    blocks: list[Block] = [
        "Targeted rows per target class: target hits / clean-correct images aimed at that class, in percent "
        "with Wilson 95% intervals (the ASR tables pool the classes). Random targets are drawn per image from "
        "(seed, dataset index), so every class gets about a ninth of the images; a generator that ignored its "
        "condition would hit each class at the rate its images fall there by chance. *Held out, pooled* adds up "
        "the victims that are not surrogates, with a 95% bootstrap interval over the test images (shared by "
        "every victim)."]
    for (label, surrogate, eps_str), sub in sel.groupby(["attack_label", "surrogate", "eps_str"], sort=True):
        victims = sorted(sub["victim"].unique())
        per = {v: json.loads(sub[sub["victim"] == v]["asr_by_target"].iloc[0]) for v in victims}
        classes = sorted({c for d in per.values() for c in d}, key=int)
        rows = []
        for c in classes:
            row = [f"{c} {names[int(c)]}" if int(c) < len(names) else str(c)]
            for v in victims:
                k, n, _ = per[v].get(c, [0, 0, None])
                lo, hi = wilson_interval(int(k), int(n))
                row.append(f"{pct(k / n) if n else 'n/a'} [{pct(lo)}, {pct(hi)}] ({k}/{n})")
            rows.append(row)
        wb = {v for v in victims if bool(sub[sub["victim"] == v]["is_whitebox"].any())}
        cols = ["target"] + [f"{v} †" if v in wb else v for v in victims]
        held = sub[~sub["victim"].isin(wb) & (sub["cell_id"] == sub["cell_id"].iloc[0])]
        pooled = _per_target_pooled(ctx.run_dir, held) if len(held) > 1 else None
        if pooled is not None:
            cols.append("held out, pooled")
            for row, c in zip(rows, classes):
                k, n, lo, hi = pooled.get(int(c), (0, 0, math.nan, math.nan))
                row.append(f"{pct(k / n) if n else 'n/a'} [{pct(lo)}, {pct(hi)}] ({k}/{n})")
        blocks.append(Table(cols, rows, f"{label} · surrogate {surrogate} · ε = {eps_str}: target hit % per class "
                                        f"(† white-box)", tex=tex_name(f"per_target_{label}_{surrogate}_eps{eps_str}")))
    return Section("Targeted attacks per target class", blocks, "per-target")


def _per_target_pooled(run_dir, rows: pd.DataFrame) -> dict[int, tuple[int, int, float, float]] | None:
    """Per target class: (hits, clean-correct images aimed at it, 95% bootstrap interval) pooled over
    ``rows`` (one targeted cell, several victims); the bootstrap resamples the test images (shared
    by every victim). None when the cell's examples or per-image tables are not in the run."""

    try:
        target = _cell_targets(run_dir, str(rows["cell_id"].iloc[0]))
        images = pooling.Images(run_dir, rows)
    except UserError:
        return None
    if target is None:
        return None
    t = np.array([target.get(int(i), -1) for i in images.index])
    S, C = images.summed(rows)
    W = pooling.boot_weights(len(images.index))
    out = {}
    for cls in sorted(set(t.tolist()) - {-1}):
        m = (t == cls).astype(np.int64)
        asr, lo, hi, _ = pooling.pooled(S * m, C * m, W)
        out[int(cls)] = (int((S * m).sum()), int((C * m).sum()), lo, hi)
    return out


def _class_names(ctx: ReportContext) -> list[str]:
    if ctx.spec.dataset.startswith("cifar10"):
        from ...data import CIFAR10_CLASSES

        return list(CIFAR10_CLASSES)
    return []


__all__ = ["held_out_transfer", "section_generative_compute", "section_generative_transfer", "section_per_target"]
