"""Report sections for learned attacks (generative, and universal beside them): the surrogate
compute of every cell of the run, so attacks that learn on training images and per-image attacks
are compared at stated compute, and the per-target success of targeted rows.

Registered with :func:`advtransfer.analysis.report_base.register_section` on import (``report.py``
imports this module at its end). Both sections return ``None`` for runs they have nothing to say
about (no generative cell; no targeted row with per-target counts).
"""
from __future__ import annotations

import json
import math

import pandas as pd

from .report_base import Block, ReportContext, Section, Table, _pct, _tex_name, register_section
from .stats import wilson_interval


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
                     _pct(r["craft_fooling_rate"]) if learned and not pd.isna(r.get("craft_fooling_rate")) else "",
                     _num(r.get("aux_passes"))])
    blocks: list[Block] = [
        "Surrogate compute of every cell, so learned and per-image attacks are compared at stated cost. "
        "A generative cell trains its generator on the first n_craft training images (never the test images "
        "it is scored on), then perturbs each test image in one forward pass, which costs no surrogate pass; "
        "a per-image attack spends its passes on each test image. *Surrogate passes* is the cell's total of "
        "forward+backward image-passes through surrogate models (a batch of B images through one model is B); "
        "*per image* divides it by the test images crafted (per-image attacks) or by the training images "
        "(learned attacks). A learned cell's cost does not grow with the number of test images it is applied "
        "to. *Fit* is the surrogate set's fooling rate (targeted: target hit rate) on up to 500 of its "
        "training images. *CLIP passes*: image-passes through a CLIP image tower (PDCL), not counted as "
        "surrogate passes.",
        Table(["attack", "kind", "surrogate", "ε", "targeted", "surrogate passes", "per image", "n_craft",
               "generator params", "generator train s", "craft s", "fit %", "CLIP passes"], rows,
              "Surrogate compute per cell", tex="generative_compute")]
    return Section("Generative attacks: compute", blocks, "generative-compute")


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
        "condition would hit each class at the rate its images fall there by chance."]
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
                row.append(f"{_pct(k / n) if n else 'n/a'} [{_pct(lo)}, {_pct(hi)}] ({k}/{n})")
            rows.append(row)
        wb = {v for v in victims if bool(sub[sub["victim"] == v]["is_whitebox"].any())}
        cols = ["target"] + [f"{v} †" if v in wb else v for v in victims]
        blocks.append(Table(cols, rows, f"{label} · surrogate {surrogate} · ε = {eps_str}: target hit % per class "
                                        f"(† white-box)", tex=_tex_name(f"per_target_{label}_{surrogate}_eps{eps_str}")))
    return Section("Targeted attacks per target class", blocks, "per-target")


def _class_names(ctx: ReportContext) -> list[str]:
    dataset = str((ctx.manifest.get("grid") or {}).get("dataset", ""))
    if dataset.startswith("cifar10"):
        from ..data import CIFAR10_CLASSES

        return list(CIFAR10_CLASSES)
    return []


__all__ = ["section_generative_compute", "section_per_target"]
