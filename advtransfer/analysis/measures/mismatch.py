"""When surrogate and victim differ in how they were trained: DUMB's mismatch table and the
lineage of adapted and fine-tuned victims.

- :func:`dumb_table`: every (surrogate, victim) row of a run classified by whether the two models
  match in dataset source, architecture and class balance (DUMB, Alecci et al. 2023); the ASR of
  each of the eight cases pooled over its model pairs, and the paired cost of each mismatch.
- :func:`lineage_table`: every row classified by how the victim descends from the surrogate
  (``init_from`` chains, :mod:`advtransfer.data.variants`): the surrogate itself, its own adapted or
  fine-tuned descendant, a descendant of another replicate of the same source (an independent
  lineage), or a model trained from scratch; and the paired contrast of a descendant with those
  controls (AdaptGuard: does a perturbation survive adaptation? DTA: does it transfer downstream?).

Intervals. A pooled ASR is Σ successes / Σ clean-correct images over the rows of a group. Its 95%
interval is a percentile bootstrap over the *test images* (one resample of the image indices shared
by every row, 2,000 resamples, seeded), so images common to all pairs are not counted as
independent draws. It does not capture model-to-model variation: each table also gives the
range of the per-pair ASRs, and each mismatch cost a sign test over the surrogates (how many of
them lose ASR when only that axis changes), which treats the trained models as the samples.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ...core.errors import UserError
from ..pooling import Images, boot_weights, pooled, pooled_diff
from ..runs import read_results

AXES = ("source", "arch", "balance")


def _read(run_dir: str | Path, attack: str | None) -> pd.DataFrame:
    res = read_results(run_dir)
    res = res[res["match"] == "none"]
    if attack:
        labels = [a.strip() for a in attack.split(",") if a.strip()]
        unknown = [a for a in labels if a not in set(res["attack_label"])]
        if unknown:
            raise UserError(f"attack {unknown[0]!r} is not in this run (it has: {', '.join(sorted(set(res['attack_label'])))})")
        res = res[res["attack_label"].isin(labels)]
    if res.empty:
        raise UserError(f"run {str(run_dir)!r} has no rows to analyse")
    return res


def _parse_data(text: str) -> dict[str, str]:
    """``'source=half_a;balance=20/80'`` → mapping, with the defaults for absent fields."""
    out = {"source": "all", "balance": "none", "shift": "none", "labels": "cifar10"}
    for part in str(text or "all").split(";"):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k] = v
    return out


def _arch(name: str, specs: dict) -> str:
    from ...models.catalogue import get_spec, split_checkpoint, split_replicate

    spec = get_spec(split_replicate(split_checkpoint(name)[0])[0], specs)
    return f"{spec.arch}{json.dumps(spec.arch_kwargs, sort_keys=True) if spec.arch_kwargs else ''}"


# --- DUMB -----------------------------------------------------------------------------------------

def dumb_table(run_dir: str | Path, attack: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """DUMB's table of a run whose surrogates and victims are single models with training-data
    variants. Returns ``(cases, costs)``.

    ``cases``: one row per (attack, ε, case) where the case says for each axis (source, arch,
    balance) whether surrogate and victim ``match``; ``n_pairs`` model pairs, pooled ``asr`` with
    its image-bootstrap interval, ``pair_asr_min``/``max``.
    ``costs``: per (attack, ε, axis), the pooled ASR of pairs that differ only on that axis minus
    that of pairs that match on all three (``any`` axis: pairs that differ on at least one), the
    paired image-bootstrap interval, and over the surrogates that have both kinds of pair the number
    whose ASR drops (``n_drop`` of ``n_surrogates``) with a two-sided sign-test p-value.
    """
    from scipy.stats import binomtest

    from ...models.catalogue import load_specs

    res = _read(run_dir, attack)
    res = res[res["n_surrogates"] == 1]
    if res.empty:
        raise UserError("DUMB's table needs single-model surrogates (this run has only ensembles)")
    specs = load_specs()
    res = res.copy()
    for who, col in (("surrogate", "surrogate_data"), ("victim", "victim_data")):
        data = res[col].map(_parse_data) if col in res.columns else pd.Series([_parse_data("")] * len(res), index=res.index)
        res[f"{who}_source"] = data.map(lambda d: d["source"])
        res[f"{who}_balance"] = data.map(lambda d: d["balance"])
        res[f"{who}_arch"] = res[who].map(lambda n: _arch(n, specs))
    for ax in AXES:
        res[ax] = np.where(res[f"surrogate_{ax}"] == res[f"victim_{ax}"], "match", "mismatch")
    imgs = Images(run_dir, res)
    W = boot_weights(len(imgs.index))
    flags = {(r.cell_id, r.victim): imgs.row(r.cell_id, r.victim) for r in res.itertuples()}

    def pool(rows: pd.DataFrame) -> tuple:
        S = sum((flags[(r.cell_id, r.victim)][0] for r in rows.itertuples()), np.zeros(len(imgs.index)))
        C = sum((flags[(r.cell_id, r.victim)][1] for r in rows.itertuples()), np.zeros(len(imgs.index)))
        return pooled(np.asarray(S, float), np.asarray(C, float), W)

    cases, costs = [], []
    for (label, eps), g in res.groupby(["attack_label", "eps"], sort=True):
        for key, rows in g.groupby(list(AXES), sort=True):
            asr, lo, hi, _ = pool(rows)
            cases.append({"attack_label": label, "eps": eps, **dict(zip(AXES, key)), "n_pairs": len(rows),
                          "n_surrogates": rows["surrogate"].nunique(), "asr": asr, "asr_ci_low": lo, "asr_ci_high": hi,
                          "pair_asr_min": float(rows["asr"].min()), "pair_asr_max": float(rows["asr"].max())})
        same = g[(g[list(AXES)] == "match").all(axis=1)]
        if same.empty:
            continue
        base = pool(same)
        for ax in (*AXES, "any"):
            if ax == "any":
                other = g[(g[list(AXES)] == "mismatch").any(axis=1)]
            else:
                rest = [a for a in AXES if a != ax]
                other = g[(g[ax] == "mismatch") & (g[rest] == "match").all(axis=1)]
            if other.empty:
                continue
            drops, n_s = 0, 0
            for s, og in other.groupby("surrogate"):
                sg = same[same["surrogate"] == s]
                if sg.empty:
                    continue
                n_s += 1
                drops += int(_rate(og) < _rate(sg))
            p = binomtest(drops, n_s).pvalue if n_s else float("nan")
            costs.append({"attack_label": label, "eps": eps, "axis": ax, "n_pairs_mismatch": len(other),
                          "n_pairs_match": len(same), "asr_match": base[0], "asr_mismatch": pool(other)[0],
                          **pooled_diff(pool(other), base), "n_surrogates": n_s, "n_drop": drops, "p_sign": float(p)})
    return pd.DataFrame(cases), pd.DataFrame(costs)


def _rate(rows: pd.DataFrame) -> float:
    """Pooled ASR of rows from their counts."""
    n = rows["n_clean_correct"].sum()
    return float(rows["n_success"].sum() / n) if n else float("nan")


# --- lineage --------------------------------------------------------------------------------------

def _chain(name: str, specs: dict, size: str) -> list[str]:
    """``name`` and the models it continues from (``init_from``), nearest first."""
    from ...models.catalogue import get_spec
    from ...models.sources import declared

    out = [name]
    seen = {name}
    while True:
        nxt = (declared(get_spec(out[-1], specs)).recipe_at(size) or {}).get("init_from")
        if not nxt or nxt in seen:
            return out
        out.append(nxt)
        seen.add(nxt)


def relation(surrogate: str, victim: str, specs: dict, size: str) -> str:
    """How ``victim`` relates to the single-model ``surrogate``: ``self``; ``descendant`` (it
    continues from the surrogate's weights); ``other_lineage`` (it descends from another
    replicate of the surrogate's recipe, or is one); ``scratch`` (no init_from: trained from a
    fresh initialisation); ``unrelated`` (it descends from some other model)."""
    from ...models.catalogue import split_replicate

    if victim == surrogate:
        return "self"
    chain = _chain(victim, specs, size)
    if surrogate in chain[1:]:
        return "descendant"
    root = split_replicate(surrogate)[0]
    if any(split_replicate(m)[0] == root for m in chain):
        return "other_lineage"
    return "scratch" if len(chain) == 1 else "unrelated"


def lineage_table(run_dir: str | Path, attack: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rows of a run grouped by victim recipe (replicate suffix dropped) and its relation to the
    surrogate; returns ``(groups, contrasts)``.

    ``groups``: per (attack, ε, victim recipe, relation): rows, pooled ASR with image-bootstrap
    interval, and the victims' task (label set) and data.
    ``contrasts``: for each descendant recipe, its pooled ASR as the surrogate's own descendant
    minus (a) as a descendant of another replicate of the source (``vs: other_lineage``, the
    AdaptGuard control: does the perturbation survive through the inherited weights?) and (b) the
    ASR of the models trained from scratch on the same data and label set (``vs: scratch``),
    with paired image-bootstrap intervals.
    """
    from ...models.catalogue import load_specs, split_replicate

    res = _read(run_dir, attack)
    res = res[res["n_surrogates"] == 1].copy()
    specs = load_specs()
    size = str(res["zoo_size"].iloc[0])
    res["relation"] = [relation(s, v, specs, size) for s, v in zip(res["surrogate"], res["victim"])]
    res["victim_recipe"] = res["victim"].map(lambda v: split_replicate(v)[0])
    if "victim_data" not in res.columns:
        res["victim_data"] = "all"
    imgs = Images(run_dir, res)
    W = boot_weights(len(imgs.index))
    flags = {(r.cell_id, r.victim): imgs.row(r.cell_id, r.victim) for r in res.itertuples()}

    def pool(rows: pd.DataFrame) -> tuple:
        S = np.zeros(len(imgs.index))
        C = np.zeros(len(imgs.index))
        for r in rows.itertuples():
            s, c = flags[(r.cell_id, r.victim)]
            S, C = S + s, C + c
        return pooled(S, C, W)

    groups, contrasts = [], []
    for (label, eps), g in res.groupby(["attack_label", "eps"], sort=True):
        for (vr, rel), rows in g.groupby(["victim_recipe", "relation"], sort=True):
            asr, lo, hi, _ = pool(rows)
            groups.append({"attack_label": label, "eps": eps, "victim_recipe": vr, "relation": rel,
                           "victim_data": rows["victim_data"].iloc[0], "n_rows": len(rows),
                           "surrogates": ",".join(sorted(set(rows["surrogate"]))),
                           "clean_acc": float(rows["clean_acc"].mean()), "asr": asr, "asr_ci_low": lo, "asr_ci_high": hi})
        for vr, d in g[g["relation"] == "descendant"].groupby("victim_recipe", sort=True):
            own = pool(d)
            controls = {"other_lineage": g[(g["victim_recipe"] == vr) & (g["relation"] == "other_lineage")
                                           & g["surrogate"].isin(d["surrogate"])],
                        "scratch": g[(g["relation"] == "scratch") & (g["victim_data"] == d["victim_data"].iloc[0])
                                     & g["surrogate"].isin(d["surrogate"])
                                     & (g["victim"].map(lambda v: _arch(v, specs)) == _arch(vr, specs))]}
            for vs, ctl in controls.items():
                if ctl.empty:
                    continue
                contrasts.append({"attack_label": label, "eps": eps, "descendant": vr, "vs": vs,
                                  "control": ",".join(sorted(set(ctl["victim_recipe"]))),
                                  "victim_data": d["victim_data"].iloc[0], "asr_descendant": own[0],
                                  "asr_control": pool(ctl)[0], **pooled_diff(own, pool(ctl)),
                                  "n_rows_descendant": len(d), "n_rows_control": len(ctl)})
    return pd.DataFrame(groups), pd.DataFrame(contrasts)
