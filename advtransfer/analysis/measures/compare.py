"""Paired comparisons of attack rows on the same images and victim, from run folders only.

Within a run (``advtransfer compare RUN``): every attack row that is not a baseline is compared
against its matched baselines, the rows whose ``baseline_for`` is its ``attack_label`` with the same
``surrogate_base``, ``eps``, ``victim``, ``seed`` and ``replicate``; or, with ``--a LABEL --b
LABEL``, row A against row B on the same keys. Across runs (``advtransfer compare RUN_A RUN_B``):
rows joined on (surrogate, attack_label, attack_params, eps, victim, seed[, replicate]), A from
RUN_A, B from RUN_B (a regression diff: positive = RUN_A's attack is stronger).

Pairs are dataset images (``index``) that the victim classifies correctly in both rows (the
images both ASRs count). Rows that differ only by ``replicate`` (independently seeded copies of
the surrogate) are pooled as strata: exact stratified test, pooled difference and interval, and
the spread of the per-replicate differences. Holm's adjustment runs over all comparisons of one
call; the verdict is taken at 0.05 on the Holm-adjusted p.

Outputs: ``OUT/<stem>.parquet`` and ``.csv`` (columns of the results schema's comparison table)
and forest plots ``OUT/figures/forest_<stem>_<eps>.png/.pdf``.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from ...core.errors import UserError
from ..runs import BASELINE_COLUMNS, read_results
from ..stats import compare_paired, holm, verdict

SAMPLE_COLUMNS = ("cell_id", "victim", "index", "clean_correct", "success")
# keys a matched pair shares besides the labels (norm/targeted only when the table has them)
PAIR_KEYS = ("surrogate_base", "eps", "victim", "seed", "replicate", "norm", "targeted")
GROUP_DROP = ("replicate",)
COLUMNS = ["a_label", "b_label", "a_cell_id", "b_cell_id", "surrogate", "victim", "eps", "eps_str", "norm",
           "targeted", "seed", "match", "n_pairs", "n_both", "n_a_only", "n_b_only", "n_neither", "asr_a", "asr_b",
           "diff", "diff_ci_low", "diff_ci_high", "p_mcnemar", "p_holm", "verdict", "method", "n_strata",
           "diff_rep_min", "diff_rep_max", "diff_rep_sd", "a_grad_evals", "b_grad_evals", "a_run", "b_run"]


class Samples:
    """Per-image tables ``RUN/samples/<cell_id>.parquet``, loaded once each."""

    def __init__(self, run_dir: str | Path) -> None:
        self.root = Path(run_dir)
        self._cache: dict[str, pd.DataFrame] = {}
        self._by_victim: dict[str, dict[str, pd.DataFrame]] = {}

    def get(self, cell_id: str, victim: str) -> pd.DataFrame:
        """Rows of one (cell, victim): columns index (int), clean_correct (bool), success (bool), and
        hit (bool: the goal met on x_adv whatever the victim said on x) where the run recorded it."""
        if cell_id not in self._by_victim:  # split once per cell: a claims table asks for each victim
            df = self.get_all(cell_id)
            cols = ["index", "clean_correct", "success"] + (["hit"] if "hit" in df.columns else [])
            self._by_victim[cell_id] = {str(v): g[cols] for v, g in df.groupby("victim", sort=False)}
        sub = self._by_victim[cell_id].get(str(victim))
        if sub is None or sub.empty:
            raise UserError(f"{self.root / 'samples' / (cell_id + '.parquet')} has no rows for victim {victim!r}; "
                            "rerun `advtransfer grid` on this run folder")
        return sub

    def get_all(self, cell_id: str) -> pd.DataFrame:
        """The cell's whole per-image table (every victim; at least :data:`SAMPLE_COLUMNS`)."""
        if cell_id not in self._cache:
            from ...run.store import RunStore

            path = self.root / "samples" / f"{cell_id}.parquet"
            df = RunStore(self.root).read_samples(cell_id, required=True)
            missing = [c for c in SAMPLE_COLUMNS if c not in df.columns]
            if missing:
                raise UserError(f"{path} lacks column(s) {', '.join(missing)} (a run from an older version); "
                                "rerun `advtransfer grid` with the current version into a new folder")
            self._cache[cell_id] = df
        return self._cache[cell_id]


def paired_outcomes(sa: pd.DataFrame, sb: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Join two per-image tables of one victim on ``index``; keep images clean-correct in both.
    Returns (index, success_a, success_b), arrays of shape (n_pairs,)."""
    ia, ib = sa["index"].to_numpy(), sb["index"].to_numpy()
    if len(np.unique(ia)) != len(ia) or len(np.unique(ib)) != len(ib):
        raise UserError("a per-image table lists an image twice for one victim (a damaged samples file); "
                        "rerun `advtransfer grid` into a new folder")
    # an inner join on the image index in A's order (numpy: a pandas merge per pair dominated `make claims`)
    common, pa, pb = np.intersect1d(ia, ib, assume_unique=True, return_indices=True)
    order = np.argsort(pa, kind="stable")
    pa, pb = pa[order], pb[order]
    keep = sa["clean_correct"].to_numpy(dtype=bool)[pa] & sb["clean_correct"].to_numpy(dtype=bool)[pb]
    pa, pb = pa[keep], pb[keep]
    return ia[pa], sa["success"].to_numpy(dtype=bool)[pa], sb["success"].to_numpy(dtype=bool)[pb]


def paired_hits(sa: pd.DataFrame, sb: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Join two per-image tables of one victim on ``index`` over *all* their common images (the
    denominator of papers reporting 1 − victim accuracy). Returns (index, hit_a, hit_b), or None
    when a table has no ``hit`` column (a run from before it was recorded)."""
    if "hit" not in sa.columns or "hit" not in sb.columns:
        return None
    ia, ib = sa["index"].to_numpy(), sb["index"].to_numpy()
    common, pa, pb = np.intersect1d(ia, ib, assume_unique=True, return_indices=True)
    order = np.argsort(pa, kind="stable")
    pa, pb = pa[order], pb[order]
    return ia[pa], sa["hit"].to_numpy(dtype=bool)[pa], sb["hit"].to_numpy(dtype=bool)[pb]


def _keys(df: pd.DataFrame, keys: Iterable[str]) -> list[str]:
    return [k for k in keys if k in df.columns]


def _compare_group(pairs: list[tuple[pd.Series, pd.Series]], samples_a: Samples, samples_b: Samples,
                   method: str, seed: int) -> dict:
    """One comparison row from the (row_a, row_b) pairs of one group (one pair per replicate)."""
    idx, sa, sb, strata = [], [], [], []
    for ra, rb in pairs:
        i, a, b = paired_outcomes(samples_a.get(ra["cell_id"], ra["victim"]), samples_b.get(rb["cell_id"], rb["victim"]))
        idx.append(i)
        sa.append(a)
        sb.append(b)
        strata.append(np.full(i.shape, int(ra["replicate"])))
    cat = np.concatenate
    res = compare_paired(cat(sa), cat(sb), strata=cat(strata), cluster=cat(idx), method=method, seed=seed)
    ra, rb = pairs[0]
    return {
        "a_label": ra["attack_label"], "b_label": rb["attack_label"],
        "a_cell_id": "+".join(str(a["cell_id"]) for a, _ in pairs),
        "b_cell_id": "+".join(str(b["cell_id"]) for _, b in pairs),
        "surrogate": ra["surrogate_base"], "victim": ra["victim"], "eps": float(ra["eps"]),
        "eps_str": ra.get("eps_str", f"{ra['eps']:.6g}"), "norm": ra.get("norm", ""),
        "targeted": bool(ra.get("targeted", False)), "seed": int(ra.get("seed", 0)),
        "match": (rb["match"] if rb["baseline_for"] == ra["attack_label"]
                  else ra["match"] if rb["attack_label"] == ra["attack_label"] else "none"),
        **{k: v for k, v in res.as_dict().items()},
        "a_grad_evals": float(np.mean([float(a.get("grad_evals", np.nan)) for a, _ in pairs])),
        "b_grad_evals": float(np.mean([float(b.get("grad_evals", np.nan)) for _, b in pairs])),
    }


def _finish(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=COLUMNS)
    df["p_holm"] = holm(df["p_mcnemar"].to_numpy())
    df["verdict"] = [verdict(d, p) for d, p in zip(df["diff"], df["p_holm"])]
    order = [c for c in COLUMNS if c in df.columns] + [c for c in df.columns if c not in COLUMNS]
    return df[order].sort_values(["eps", "victim", "surrogate", "a_label", "b_label"], kind="stable").reset_index(drop=True)


def _grouped(merged: pd.DataFrame, group_keys: list[str]) -> list[list[tuple[pd.Series, pd.Series]]]:
    out = []
    for _, g in merged.groupby(group_keys, sort=True, dropna=False):
        pairs = []
        for _, r in g.sort_values("replicate_a" if "replicate_a" in g.columns else group_keys[0]).iterrows():
            ra = pd.Series({k[:-2]: v for k, v in r.items() if k.endswith("_a")})
            rb = pd.Series({k[:-2]: v for k, v in r.items() if k.endswith("_b")})
            pairs.append((ra, rb))
        out.append(pairs)
    return out


def _merge(a: pd.DataFrame, b: pd.DataFrame, left_on: list[str], right_on: list[str]) -> pd.DataFrame:
    a = a.rename(columns={c: f"{c}_a" for c in a.columns})
    b = b.rename(columns={c: f"{c}_b" for c in b.columns})
    return a.merge(b, left_on=[f"{k}_a" for k in left_on], right_on=[f"{k}_b" for k in right_on])


def compare_run(run_dir: str | Path, a_label: str | None = None, b_label: str | None = None,
                method: str = "newcombe", seed: int = 0) -> pd.DataFrame:
    """Comparison table of one run: attacks against their matched baselines, or ``a_label``
    against ``b_label``. Rates in [0, 1]; ``diff = asr_a - asr_b``. Writes nothing."""
    df = read_results(run_dir)
    keys = _keys(df, PAIR_KEYS)
    if (a_label is None) != (b_label is None):
        raise UserError("give both --a LABEL and --b LABEL, or neither (then every attack is compared with its matched baselines)")
    labels = sorted(df["attack_label"].unique())
    if a_label is not None:
        for lab in (a_label, b_label):
            if lab not in labels:
                raise UserError(f"attack label {lab!r} is not in {run_dir}; labels there: {', '.join(labels)}")
        merged = _merge(df[df["attack_label"] == a_label], df[df["attack_label"] == b_label], keys, keys)
        if merged.empty:
            raise UserError(f"rows of {a_label!r} and {b_label!r} share no (surrogate, eps, victim, seed, replicate); "
                            "nothing to pair")
    else:
        missing = df.attrs["missing"]
        if "baseline_for" in missing:
            raise UserError(f"{run_dir} has no `baseline_for` column (a run from before matched baselines): rerun the "
                            "grid with the current version, or name a pair with --a LABEL --b LABEL")
        # a baseline row may serve several attacks (``baseline_for`` lists their labels, comma-separated)
        base = df[df["baseline_for"] != ""].assign(baseline_for=lambda d: d["baseline_for"].str.split(","))
        base = base.explode("baseline_for", ignore_index=True)
        att = df[df["baseline_for"] == ""]
        if base.empty:
            from ...run.store import RunStore

            ref = RunStore(run_dir).read_manifest().get("reference")
            hint = f"compare its surrogates with --reference {ref} (its grid's reference), or " if ref else ""
            raise UserError(f"{run_dir} has no matched baseline rows (no grid entry asked for one); "
                            f"{hint}name a pair with --a LABEL --b LABEL")
        merged = _merge(att, base, ["attack_label", *keys], ["baseline_for", *keys])
        if merged.empty:
            raise UserError(f"no baseline row of {run_dir} matches an attack row on (surrogate_base, eps, victim, seed, "
                            "replicate); check the grid's baseline entries")
    group = ["attack_label_a", "attack_label_b"] + [f"{k}_a" for k in keys if k not in GROUP_DROP]
    samples = Samples(run_dir)
    rows = [_compare_group(p, samples, samples, method, seed) for p in _grouped(merged, group)]
    out = _finish(rows)
    out["a_run"] = out["b_run"] = Path(run_dir).name
    return out


def compare_surrogates(run_dir: str | Path, reference: str, method: str = "newcombe", seed: int = 0) -> pd.DataFrame:
    """Comparison table of one run by surrogate: every other surrogate (``surrogate_base``) against
    ``reference`` under the same attack label, ε, seed and victim, paired on the images; replicate
    k of one is paired with replicate k of the other and replicates are pooled as strata (they are
    independent trainings, so the pairing by index is arbitrary but each stratum is a valid paired
    comparison on the same images). ``a_label``/``b_label`` hold the surrogate names here, the
    attack is in ``attack_label`` and ``compare_by`` is 'surrogate'."""
    df = read_results(run_dir)
    bases = sorted(df["surrogate_base"].unique())
    if reference not in bases:
        raise UserError(f"reference surrogate {reference!r} is not in {run_dir}; surrogates there: {', '.join(bases)}")
    keys = _keys(df, ("attack_label", "eps", "victim", "seed", "replicate", "norm", "targeted"))
    ref = df[df["surrogate_base"] == reference]
    rest = df[(df["surrogate_base"] != reference) & ~df["is_whitebox"].astype(bool)]
    merged = _merge(rest, ref, keys, keys)
    if merged.empty:
        raise UserError(f"no row of {run_dir} shares (attack, eps, victim, seed, replicate) with {reference!r}")
    group = ["surrogate_base_a"] + [f"{k}_a" for k in keys if k not in GROUP_DROP]
    return _within_run(run_dir, merged, group, method, seed, lambda ra, rb: dict(
        a_label=ra["surrogate_base"], b_label=rb["surrogate_base"], surrogate=ra["surrogate_base"],
        attack_label=ra["attack_label"], match="none", compare_by="surrogate"))


def _within_run(run_dir: str | Path, merged: pd.DataFrame, group: list[str], method: str, seed: int,
                fields, strata=None) -> pd.DataFrame:
    """The comparison table of one run's merged (A, B) row pairs, one row per ``group``: each
    group's pairs (``strata(pairs)`` first, if given, to set their stratum) compared on the run's
    per-image records, then labelled with ``fields(first A row, first B row)``."""
    samples = Samples(run_dir)
    rows = []
    for pairs in _grouped(merged, group):
        if strata is not None:
            pairs = strata(pairs)
        row = _compare_group(pairs, samples, samples, method, seed)
        row.update(fields(*pairs[0]))
        rows.append(row)
    out = _finish(rows)
    out["a_run"] = out["b_run"] = Path(run_dir).name
    return out


def compare_victims(run_dir: str | Path, reference: str, method: str = "newcombe", seed: int = 0) -> pd.DataFrame:
    """Comparison table of one run by victim: every other victim against the ``reference`` victim
    on the same crafted examples (the same cell), paired on the images both classify correctly
    when clean (so each side's rate here may differ from its row's ``asr``, which counts that
    victim's own clean-correct images). The question it answers: is this defence less fooled by
    the same adversarial examples than that one? Victim replicates (``<entry>@r<k>``, independently
    trained copies) are pooled as strata: replicate k of a victim is paired with replicate k of
    the reference where the run has it, else with the reference itself, on every cell of the
    (surrogate, attack, ε, seed). ``a_label``/``b_label`` hold the victim entries, the attack is in
    ``attack_label``, ``compare_by`` is 'victim'; ``diff = asr_a - asr_b`` (negative: victim A
    is fooled less). White-box rows are left out."""
    from ...models.catalogue import split_replicate

    df = read_results(run_dir)
    df = df[~df["is_whitebox"].astype(bool)].copy()
    parts = [split_replicate(str(v)) for v in df["victim"]]
    df["victim_base"] = [b for b, _ in parts]
    df["victim_rep"] = [k for _, k in parts]
    bases = sorted(df["victim_base"].unique())
    if reference not in bases:
        raise UserError(f"reference victim {reference!r} is not in {run_dir}; victims there: {', '.join(bases)}")
    ref = df[df["victim_base"] == reference]
    ref_reps = set(ref["victim_rep"])
    rest = df[df["victim_base"] != reference].copy()
    rest["ref_rep"] = [k if k in ref_reps else 0 for k in rest["victim_rep"]]
    merged = _merge(rest, ref.assign(ref_rep=ref["victim_rep"]), ["cell_id", "ref_rep"], ["cell_id", "ref_rep"])
    if merged.empty:
        raise UserError(f"no cell of {run_dir} has both {reference!r} and another victim (white-box rows left out)")
    def strata(pairs):  # the victim replicate (and the surrogate replicate, if the run has several)
        pairs = [(ra.copy(), rb) for ra, rb in pairs]
        for ra, _ in pairs:
            ra["replicate"] = int(ra["victim_rep"]) * 1000 + int(ra["replicate"])
        return pairs

    return _within_run(run_dir, merged, ["victim_base_a", "surrogate_base_a", "attack_label_a", "eps_a", "seed_a"],
                       method, seed, lambda ra, rb: dict(
                           a_label=ra["victim_base"], b_label=rb["victim_base"], victim=ra["victim_base"],
                           attack_label=ra["attack_label"], match="none", compare_by="victim"), strata)


def compare_runs(run_a: str | Path, run_b: str | Path, method: str = "newcombe", seed: int = 0) -> pd.DataFrame:
    """Regression diff of two runs: each row of RUN_A against the row of RUN_B with the same
    (surrogate, attack_label, attack_params, eps, victim, seed, replicate); replicates pooled
    per surrogate_base. ``diff = asr_a - asr_b`` (positive: RUN_A's attack is stronger)."""
    da, db = read_results(run_a), read_results(run_b)
    keys = [k for k in ("surrogate", "attack_label", "attack_params", "eps", "victim", "seed", "replicate", "norm",
                        "targeted") if k in da.columns and k in db.columns]
    merged = _merge(da, db, keys, keys)
    if merged.empty:
        raise UserError(f"{run_a} and {run_b} share no row on ({', '.join(keys)}); nothing to compare")
    group = [f"{k}_a" for k in ("surrogate_base", *keys) if k not in GROUP_DROP and k != "surrogate"]
    rows = [_compare_group(p, Samples(run_a), Samples(run_b), method, seed) for p in _grouped(merged, group)]
    out = _finish(rows)
    out["a_run"], out["b_run"] = Path(run_a).name, Path(run_b).name
    return out


def write_comparisons(df: pd.DataFrame, out_dir: str | Path, stem: str = "comparisons") -> list[Path]:
    """Write ``OUT/<stem>.parquet`` and ``.csv`` atomically; returns the paths."""
    from ...core.utils import atomic_path

    out_dir = Path(out_dir)
    paths = [out_dir / f"{stem}.parquet", out_dir / f"{stem}.csv"]
    with atomic_path(paths[0]) as tmp:
        df.to_parquet(tmp, index=False)
    with atomic_path(paths[1]) as tmp:
        df.to_csv(tmp, index=False)
    return paths


def is_current(run_dir: str | Path, stem: str = "comparisons") -> bool:
    """Whether ``RUN/<stem>.parquet`` exists and is at least as new as ``RUN/results.parquet``
    (older: the grid added rows since it was written)."""
    path, results = Path(run_dir) / f"{stem}.parquet", Path(run_dir) / "results.parquet"
    return path.is_file() and (not results.is_file() or path.stat().st_mtime_ns >= results.stat().st_mtime_ns)


def refresh_comparisons(run_dir: str | Path) -> str:
    """Write ``RUN/comparisons.parquet/.csv`` and the forest plots with the default settings of
    ``advtransfer compare`` (the grid's ``reference`` surrogate when it has one, else the matched
    baselines) unless the table is current (:func:`is_current`); the report then reads them.
    Returns the note the report prints beside the table: '' when it was current, a sentence when
    it was computed now, or why the run has nothing to compare (then nothing is written)."""
    from ...run.store import RunStore

    run = Path(run_dir)
    results = read_results(run)  # a missing folder or a damaged table is an error, not a note
    if results.empty or is_current(run):
        return ""
    reference = RunStore(run).read_manifest().get("reference")
    try:
        df = compare_surrogates(run, reference) if reference else compare_run(run)
    except UserError as exc:
        return f"No comparisons: {exc}."
    write_comparisons(df, run)
    forest_plot(df, run)
    verdict_plot(df, results, run)
    return "(Computed for this report with the default settings of `advtransfer compare`.)"


def _fmt_pts(v: float) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:+.1f}"


def format_table(df: pd.DataFrame) -> str:
    """A readable text table of a comparison table (differences in percentage points)."""
    if df.empty:
        return "(no comparisons)"
    t = pd.DataFrame({
        "A": df["a_label"], "B": df["b_label"], "surrogate": df["surrogate"], "victim": df["victim"],
        "eps": df["eps_str"], "match": df["match"], "n": df["n_pairs"], "A only": df["n_a_only"],
        "B only": df["n_b_only"],
        "ASR A %": (100 * df["asr_a"]).round(1), "ASR B %": (100 * df["asr_b"]).round(1),
        "diff pts [95% CI]": [f"{_fmt_pts(d)} [{_fmt_pts(lo)}, {_fmt_pts(hi)}]"
                              for d, lo, hi in zip(df["diff"], df["diff_ci_low"], df["diff_ci_high"])],
        "p": df["p_mcnemar"].map(lambda p: f"{p:.3g}"), "p Holm": df["p_holm"].map(lambda p: f"{p:.3g}"),
        "verdict": df["verdict"], "strata": df["n_strata"],
    })
    if "attack_label" in df.columns:  # comparisons of surrogates or victims: the attack they share
        t.insert(2, "attack", df["attack_label"].fillna(""))
    return t.to_string(index=False)


def forest_plot(df: pd.DataFrame, out_dir: str | Path, stem: str = "comparisons",
                formats: tuple[str, ...] = ("png", "pdf")) -> list[Path]:
    """Forest plots of a comparison table, one per (eps, norm, targeted), into ``OUT/figures/``:
    each comparison's difference in percentage points with its 95% interval, grouped by victim,
    zero line; Holm-significant comparisons drawn filled and starred. Returns the paths."""
    from ..plots import pyplot

    plt = pyplot()

    from ..plots import save_figure

    out = Path(out_dir) / "figures"
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if df.empty:
        return written
    for (eps_str, norm, targeted), sub in df.groupby(["eps_str", "norm", "targeted"], sort=True):
        sub = sub.sort_values(["victim", "surrogate", "a_label", "b_label"], kind="stable")
        ys, labels, y = [], [], 0
        headers = []
        for victim, g in sub.groupby("victim", sort=True):
            headers.append((y, victim))
            y += 1
            for _, r in g.iterrows():
                ys.append(y)
                lab = f"{r['a_label']} vs {r['b_label']}"
                lab += f" · {r['surrogate']}" if sub["surrogate"].nunique() > 1 else ""
                lab += f" · {r['n_strata']} reps" if r["n_strata"] > 1 else ""
                labels.append(lab)
                y += 1
            y += 0.4
        fig_h = 1.6 + 0.32 * y
        fig, ax = plt.subplots(figsize=(9.0, fig_h))
        d = 100 * sub["diff"].to_numpy(dtype=float)
        lo = 100 * sub["diff_ci_low"].to_numpy(dtype=float)
        hi = 100 * sub["diff_ci_high"].to_numpy(dtype=float)
        sig = (sub["verdict"] != "no_difference").to_numpy()
        ys_a = np.array(ys, dtype=float)
        ax.axvline(0, color="0.3", lw=1, ls="--", zorder=1)
        ax.hlines(ys_a, lo, hi, color="0.25", lw=1.6, zorder=2)
        ax.scatter(d[~sig], ys_a[~sig], s=36, facecolor="white", edgecolor="0.15", zorder=3, label="not significant (Holm)")
        ax.scatter(d[sig], ys_a[sig], s=40, color="tab:red", zorder=3, label="significant at 0.05 (Holm)")
        finite = np.concatenate([lo[np.isfinite(lo)], hi[np.isfinite(hi)], [0.0]])
        span = max(finite.max() - finite.min(), 1.0)
        xmin, xmax = finite.min() - 0.08 * span, finite.max() + 0.08 * span
        tr = ax.get_yaxis_transform()  # x in axes fraction, y in data: the numbers sit right of the axes
        for yy, di, lo_i, hi_i, s, p in zip(ys_a, d, lo, hi, sig, sub["p_holm"]):
            txt = f"{di:+.1f} [{lo_i:+.1f}, {hi_i:+.1f}]  Holm p={p:.2g}" + (" *" if s else "")
            ax.text(1.02, yy, txt, transform=tr, va="center", ha="left", fontsize=7,
                    color="tab:red" if s else "0.2")
        for yy, victim in headers:
            ax.text(xmin, yy, victim, va="center", ha="left", fontsize=8.5, weight="bold")
        ax.set_xlim(xmin, xmax)
        ax.set_yticks(ys_a, labels, fontsize=7.5)
        ax.set_ylim(y - 0.2, -0.8)
        ax.set_xlabel("ASR difference A − B (percentage points, 95% CI)", fontsize=8)
        method = ", ".join(sorted(m.capitalize() for m in sub["method"].unique()))
        ax.set_title(f"{norm} ε={eps_str}{' · targeted' if targeted else ''} · paired on the same images "
                     f"({method} CI, exact McNemar)", fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
        ax.legend(loc="upper left", fontsize=7, frameon=False, bbox_to_anchor=(1.0, -0.6 / fig_h), ncol=1)
        ax.grid(axis="x", color="0.9", lw=0.6, zorder=0)
        fig.tight_layout()
        written += save_figure(fig, out, f"forest_{stem}_{norm}_eps{str(eps_str).replace('/', '-')}"
                                         f"{'_targeted' if targeted else ''}", formats, tight=True)
    return written


def verdict_plot(cmp: pd.DataFrame, results: pd.DataFrame, out_dir: str | Path, stem: str = "comparisons",
                 formats: tuple[str, ...] = ("png", "pdf")) -> list[Path]:
    """A compact summary of a run's verdicts into ``OUT/figures/verdict_<stem>.*``: one row per
    attack and matching, each held-out comparison (victim × surrogate × ε) a dot at its difference
    in percentage points, red where A is significantly better (Holm), blue where worse, grey where
    level, and a bar at the row's median. Empty list when nothing is held out."""
    from ..plots import pyplot, save_figure
    from ..verdicts import held_out

    held = held_out(cmp, results)
    held = held[held["a_label"] != held["b_label"]]
    if held.empty:
        return []
    plt = pyplot()
    groups = list(held.groupby(["a_label", "match"], sort=True))
    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.34 * len(groups)))
    colours = {"a_better": "tab:red", "b_better": "tab:blue", "no_difference": "0.6"}
    rng = np.random.default_rng(0)  # vertical jitter only, so dots at one difference stay visible
    labels = []
    for k, ((a, match), g) in enumerate(groups):
        d = 100 * g["diff"].to_numpy(dtype=float)
        ax.scatter(d, k + rng.uniform(-0.18, 0.18, len(d)), s=14, c=[colours.get(v, "0.6") for v in g["verdict"]],
                   edgecolors="none", zorder=3)
        ax.plot([np.median(d)] * 2, [k - 0.32, k + 0.32], color="0.1", lw=2, zorder=4)
        labels.append(f"{a} · {match}-matched" if match in ("step", "evals") else f"{a} vs {g['b_label'].iloc[0]}")
    ax.axvline(0, color="0.3", lw=1, ls="--", zorder=1)
    ax.set_yticks(range(len(groups)), labels, fontsize=8)
    ax.set_ylim(len(groups) - 0.5, -0.5)
    ax.set_xlabel("ASR difference A − matched baseline, percentage points (one dot per held-out victim × "
                  "surrogate × ε; bar: median)", fontsize=7.5)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", color="0.9", lw=0.6, zorder=0)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], ls="", marker="o", color=c, label=t) for c, t in
               (("tab:red", "A better (Holm 0.05)"), ("tab:blue", "A worse"), ("0.6", "no significant difference"))]
    ax.legend(handles=handles, fontsize=7, frameon=False, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3)
    fig.tight_layout()
    out = Path(out_dir) / "figures"
    out.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, out, f"verdict_{stem}", formats, tight=True)
