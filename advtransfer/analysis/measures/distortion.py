"""Minimal distortion along the transfer direction ("distortion at the centre", after FiT).

For an image x (pixels in [0,1], 3×H×W), its transferred adversarial example x_adv and the
direction δ = x_adv − x, the victim f is queried along the ray

    x(t) = clip(x + t·δ, 0, 1),   t ≥ 0 (a unitless scale: t = 1 is x_adv itself),

and the **minimal scale** is t* = min{t ≥ 0 : f is fooled by x(t)} (untargeted: argmax f(x(t)) ≠ y;
targeted: argmax f(x(t)) = target). Reported per image: ``min_scale`` t̂ (the search's answer, a
scale the victim was seen to be fooled at), ``min_linf`` = ‖x(t̂) − x‖∞ and ``min_l2`` =
‖x(t̂) − x‖₂ (pixels in [0,1]; L∞ reads like ε, e.g. 8/255 ≈ 0.0314), ``min_exact`` (below) and
``queries``, the number of victim forward passes spent on that image.

Search (:func:`min_scale_search`), batched: every still-unresolved image of a batch is sent to
the victim in one forward pass per iteration (one iteration per scan point, then per halving).

1. t = 0: one query. Already fooled (a clean-misclassified image) → t̂ = 0, distortion 0, exact.
   δ = 0 (x_adv = x): the ray never leaves x → t̂ = inf after this one query.
2. Scan, to find the *first* crossing at a stated resolution: every image is queried at every
   point of the grid G = {1/K, 2/K, ...} below ``cap``, then the cap itself (K =
   ``scan_per_unit``, default 4, so a step of 1/4 and 16 points for cap 4; t = 1, x_adv, is a
   scan point). The first scan point t_j that fools gives the bracket [t_{j−1}, t_j] (t_0 = 0).
   Not fooled at any scan point → t̂ = inf, min_linf = min_l2 = inf ("not fooled up to the cap").
   Why a uniform grid over the whole (0, cap], scanned in full: uniform in t is uniform in L∞
   before clipping (step ‖δ‖∞/K, ε/K for an L∞ attack at its budget), like the L∞ grid of the success curve below, so no part of
   [0, cap·‖δ‖∞] is looked at more coarsely than another (doubling points above t = 1, as the former
   bracket 1, 2, 4 had, leave steps of 1 and 2 there, wide enough for fooled islands to hide in);
   scanning past the first fooled point costs nothing for images never fooled (they need every
   point anyway) and is what lets ``min_exact`` see a ray turn back to not fooled.
3. Bisection on [lo, hi] = [t_{j−1}, t_j] (lo not fooled, hi fooled) until hi − lo ≤
   max(rel_tol·hi, abs_tol / ‖δ‖∞), i.e. the scale is known to a relative 1/64 (``rel_tol``) or to
   1/255/8 ≈ 4.9e-4 in L∞ (``abs_tol``), whichever is reached first. t̂ is the final ``hi``.

``min_exact`` (per image; 1 = exact, 0 = upper bound). Call the ray *monotone* when, once fooled,
the victim stays fooled up to the cap: the fooled scales in [0, cap] are [t*, cap]. ``min_exact``
is 1 when every query made on the image is consistent with a monotone ray: the decisions at the
scan points switch at most once, from not fooled to fooled (each queried scale below t̂ was not
fooled, by construction, and each scan point above t̂ was fooled). Then, *if the ray is
monotone*, t* ≤ t̂ ≤ t* + tolerance. It is 0 when the scan saw the victim fooled at one scan point
and not fooled at a larger one (e.g. fooled at t = 0.25 but not at x_adv, t = 1): the ray is then
provably not monotone, fooled islands exist along it, and one narrower than the scan step may lie
unseen below t̂; t̂ is only a scale known to fool, an upper bound on t*. This is deliberately
conservative: the turn back to not fooled can lie *above* t̂, where it does not move the minimum.
Images fooled at t = 0 and images never fooled (t̂ = inf) are exact by this definition.

What the scan does and does not guarantee (always: t* ≤ t̂, since t̂ was seen to fool):
- Any fooled stretch of the ray at least 1/K wide contains a scan point. So if the first fooled
  stretch is that wide, the first fooled scan point lies in it, the bracket holds only its start,
  and bisection returns that start within the tolerance: the first crossing, not a later one.
- A fooled island narrower than 1/K that falls between two scan points is never seen. A ray whose
  only non-monotone features are such islands gets min_exact = 1 while t̂ overstates t*:
  min_exact = 1 means "no non-monotonicity seen at this resolution", not a certificate (no finite
  set of queries to a black box can give one). Inside the bracket, bisection follows *a* crossing;
  if the bracket holds several, t̂ still lies in (t_{j−1}, t_j], within one scan step of the first.

Queries per image are exact: 1 (t = 0), plus, for an image not fooled at x and δ ≠ 0, one per
scan point (⌈K·cap⌉: 16 at the defaults) and the bisection steps. E.g. at the defaults an image
not fooled up to the cap costs 1 + 16 = 17; one first fooled at a scan point, with rel_tol = 0 and
abs_tol/‖δ‖∞ = 1/64, costs 1 + 16 + 4 (a bracket of 1/4 halved to 1/64).

Row summaries (:func:`summarize`): over the victim's clean-correct images, median and quartiles
of min L∞ and L2 (inf counts as "not fooled within the cap"), the success-vs-distortion curve
S(r) = #{clean-correct i : min_linf_i ≤ r} / #clean-correct on a grid r ∈ [0, r_max], and its
normalised area AUC = (1/r_max)∫₀^{r_max} S(r) dr (trapezoid rule, r_max = 16/255 by default), in
[0, 1]: 1 means every image is fooled at zero distortion; ``n_upper_bound`` and
``frac_upper_bound``, the clean-correct images whose min_exact is 0 and their share.

:func:`measure_run` measures every cell of a run folder and merges the results into
``samples/<cell_id>.parquet``, each image's row with ``min_search``, the search and its parameters
(:func:`search_spec`); rows measured by another search or with other parameters (or before the
column existed) are measured again. The summary goes to ``RUN/distortion.parquet`` and ``.csv``.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from ...core.errors import UserError
from ...run.store import RunStore
from ...core.utils import atomic_path
from ..runs import read_samples, run_context

DEFAULT_CAP = 4.0
DEFAULT_REL_TOL = 1.0 / 64
DEFAULT_ABS_TOL = 1.0 / 255 / 8      # L∞ tolerance in pixel units
DEFAULT_SCAN_PER_UNIT = 4            # scan points per unit of scale: step 1/4 in t over (0, cap]
DEFAULT_R_MAX = 16.0 / 255           # right end of the L∞ success-vs-distortion curve
#: version of the search; bump whenever its answers change (measure_run then measures again)
SEARCH_VERSION = 3
MEASURED_COLUMNS = ("min_scale", "min_linf", "min_l2", "min_exact", "queries")


def search_spec(cap: float = DEFAULT_CAP, rel_tol: float = DEFAULT_REL_TOL, abs_tol: float = DEFAULT_ABS_TOL,
                scan_per_unit: int = DEFAULT_SCAN_PER_UNIT) -> str:
    """The search and its parameters as recorded per image in ``min_search`` (exact float reprs)."""
    return f"scan-bisect v{SEARCH_VERSION}: scan_per_unit={int(scan_per_unit)} cap={float(cap)!r} " \
           f"rel_tol={float(rel_tol)!r} abs_tol={float(abs_tol)!r}"


def scan_grid(cap: float = DEFAULT_CAP, scan_per_unit: int = DEFAULT_SCAN_PER_UNIT) -> list[float]:
    """The scan's scales in increasing order: k/K for k = 1, 2, ... below the cap, then the cap
    (K = ``scan_per_unit``; t = 1, x_adv itself, is one of them when cap ≥ 1)."""
    k = int(scan_per_unit)
    return [i / k for i in range(1, math.ceil(cap * k) + 1) if i / k < cap] + [float(cap)]


def linf_grid(r_max: float = DEFAULT_R_MAX, points: int = 65) -> np.ndarray:
    """Evenly spaced L∞ radii 0..r_max (pixels in [0,1]); 65 points = steps of 1/1020 for 16/255."""
    return np.linspace(0.0, r_max, points)


@torch.no_grad()
def _fooled(victim: nn.Module, x: torch.Tensor, goal: torch.Tensor, targeted: bool) -> torch.Tensor:
    from ...core.metrics import ABSTAIN, decide

    pred = decide(victim, victim(x))
    return pred == goal if targeted else (pred != goal) & (pred != ABSTAIN)


@torch.no_grad()
def min_scale_search(victim: nn.Module, x: torch.Tensor, x_adv: torch.Tensor, y: torch.Tensor,
                     targeted: bool = False, cap: float = DEFAULT_CAP, rel_tol: float = DEFAULT_REL_TOL,
                     abs_tol: float = DEFAULT_ABS_TOL, batch_size: int = 500, device: str = "cpu",
                     scan_per_unit: int = DEFAULT_SCAN_PER_UNIT) -> dict[str, torch.Tensor]:
    """Minimal fooling scale along δ = x_adv − x for each image (see the module docstring).

    x, x_adv: N×C×H×W float in [0,1]; y: int64 N, true labels (targeted: the targets).
    ``cap`` (> 0): largest scale tried; ``rel_tol`` (relative to the scale) and ``abs_tol``
    (L∞ in pixel units) set when bisection stops; ``scan_per_unit`` (K ≥ 1): scan points per unit
    of scale, the scan's resolution is a step of 1/K in t over (0, cap].
    Returns CPU tensors of length N: ``min_scale`` (float64; inf if not fooled at any scan point
    up to the cap, 0 if fooled at x), ``min_linf``, ``min_l2`` (float64, of clip(x + t̂·δ) − x per
    image), ``min_exact`` (bool; False: the scan saw the victim fooled and then not fooled at a
    larger scale, so min_scale is an upper bound) and ``queries`` (int64, victim forward passes
    per image).
    """
    if not cap > 0 or not math.isfinite(cap):
        raise UserError(f"cap must be a positive finite scale, got {cap}")
    if rel_tol < 0 or abs_tol < 0 or (rel_tol == 0 and abs_tol == 0):
        raise UserError(f"tolerances must be >= 0 and not both 0 (rel_tol={rel_tol}, abs_tol={abs_tol})")
    if isinstance(scan_per_unit, bool) or int(scan_per_unit) != scan_per_unit or scan_per_unit < 1:
        raise UserError(f"scan_per_unit must be a positive integer, got {scan_per_unit}")
    if x.shape != x_adv.shape or len(y) != len(x):
        raise UserError(f"x {tuple(x.shape)}, x_adv {tuple(x_adv.shape)} and y ({len(y)}) do not match")
    grid = scan_grid(cap, int(scan_per_unit))
    outs = [_search_batch(victim, x[s:s + batch_size].to(device), x_adv[s:s + batch_size].to(device),
                          y[s:s + batch_size].to(device), targeted, grid, rel_tol, abs_tol)
            for s in range(0, len(x), batch_size)]
    if not outs:
        e = torch.zeros(0, dtype=torch.float64)
        return {"min_scale": e, "min_linf": e.clone(), "min_l2": e.clone(), "min_exact": torch.zeros(0, dtype=torch.bool),
                "queries": torch.zeros(0, dtype=torch.int64)}
    return {k: torch.cat([o[k] for o in outs]) for k in outs[0]}


def _search_batch(victim, x, x_adv, y, targeted, grid, rel_tol, abs_tol) -> dict[str, torch.Tensor]:
    n = len(x)
    delta = x_adv - x
    dinf = delta.flatten(1).abs().amax(1).double().cpu()
    queries = torch.zeros(n, dtype=torch.int64)
    lo = torch.zeros(n, dtype=torch.float64)
    hi = torch.full((n,), math.inf, dtype=torch.float64)
    exact = torch.ones(n, dtype=torch.bool)

    def at(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Query the victim at scales t (float64, len(idx)) for images idx; count one query each."""
        tt = t.to(x.dtype).to(x.device).view(-1, *([1] * (x.dim() - 1)))
        xi = (x[idx] + tt * delta[idx]).clamp(0, 1)
        queries[idx] += 1
        return _fooled(victim, xi, y[idx], targeted).cpu()

    all_idx = torch.arange(n)
    f0 = at(torch.zeros(n, dtype=torch.float64), all_idx)
    hi[f0] = 0.0
    # scan every grid point for every image not fooled at x (images with δ = 0 can never be
    # fooled away from x): the first fooled point and the one before it bracket the first crossing
    scanned = all_idx[~f0 & (dinf > 0)]
    seen = torch.zeros(n, dtype=torch.bool)          # fooled at some scan point so far
    for t in grid:
        if not len(scanned):
            break
        f = at(torch.full((len(scanned),), t, dtype=torch.float64), scanned)
        before = seen[scanned]
        hi[scanned[f & ~before]] = t                 # the first scan point that fools
        lo[scanned[~f & ~before]] = t                # the last scan point before it
        exact[scanned[~f & before]] = False          # fooled earlier, not fooled here
        seen[scanned[f]] = True
    # bisection inside [lo, hi] for images with a finite, positive bracket
    scale_tol = torch.where(dinf > 0, abs_tol / dinf.clamp_min(1e-300), torch.full_like(dinf, math.inf))

    def unresolved() -> torch.Tensor:
        width = hi - lo
        tol = torch.maximum(rel_tol * hi, scale_tol)
        return all_idx[torch.isfinite(hi) & (hi > 0) & (width > tol)]

    active = unresolved()
    while len(active):
        mid = (lo[active] + hi[active]) / 2
        f = at(mid, active)
        hi[active[f]] = mid[f]
        lo[active[~f]] = mid[~f]
        active = unresolved()
    fin = torch.isfinite(hi)
    tt = torch.where(fin, hi, torch.zeros_like(hi)).to(x.dtype).to(x.device).view(-1, *([1] * (x.dim() - 1)))
    d = ((x + tt * delta).clamp(0, 1) - x).flatten(1).double().cpu()
    inf = torch.full((n,), math.inf, dtype=torch.float64)
    return {"min_scale": hi, "min_linf": torch.where(fin, d.abs().amax(1), inf),
            "min_l2": torch.where(fin, d.norm(dim=1), inf), "min_exact": exact, "queries": queries}


# --- summaries ---------------------------------------------------------------------------------

def success_curve(min_dist: np.ndarray | Sequence[float], grid: np.ndarray | Sequence[float]) -> np.ndarray:
    """S(r) = fraction of the given images with min_dist ≤ r, for each r of ``grid``.

    Pass only the clean-correct images (inf = not fooled within the cap). Non-decreasing in r by
    construction; empty input gives NaNs.
    """
    d = np.asarray(min_dist, dtype=float)
    g = np.asarray(grid, dtype=float)
    if d.size == 0:
        return np.full(g.shape, np.nan)
    return (d[None, :] <= g[:, None]).mean(1)


def curve_auc(grid: np.ndarray | Sequence[float], curve: np.ndarray | Sequence[float]) -> float:
    """Normalised area (1/(r_max − r_0)) ∫ S(r) dr by the trapezoid rule; in [0, 1]."""
    g, c = np.asarray(grid, dtype=float), np.asarray(curve, dtype=float)
    if len(g) < 2 or np.isnan(c).any():
        return float("nan")
    return float(np.trapezoid(c, g) / (g[-1] - g[0]))


def _q(v: np.ndarray, p: float) -> float:
    """Quantile that keeps inf (not fooled) as inf: inverted-CDF order statistic, NaN if empty."""
    if v.size == 0:
        return float("nan")
    return float(np.quantile(v, p, method="inverted_cdf"))


def summarize(min_linf: np.ndarray | Sequence[float], min_l2: np.ndarray | Sequence[float],
              clean_correct: np.ndarray | Sequence[bool], r_max: float = DEFAULT_R_MAX,
              min_exact: np.ndarray | Sequence[float] | None = None) -> dict[str, float]:
    """Row summary over clean-correct images: median/q25/q75 of min L∞ and L2 (order statistics,
    so they are inf when more than that share is not fooled within the cap), ``auc`` of the L∞
    success-vs-distortion curve on [0, r_max], ``n_fooled_within_cap``, ``n_clean_correct``, and
    from ``min_exact`` (1/True exact, 0/False upper bound; NaN: not measured by the scan)
    ``n_upper_bound`` and ``frac_upper_bound`` = n_upper_bound / n_clean_correct (NaN when
    ``min_exact`` is not given, any clean-correct image lacks it, or there is no clean-correct image)."""
    cc = np.asarray(clean_correct, dtype=bool)
    li = np.asarray(min_linf, dtype=float)[cc]
    l2 = np.asarray(min_l2, dtype=float)[cc]
    g = linf_grid(r_max)
    out = {f"{s}_min_{k}": _q(v, p) for k, v in (("linf", li), ("l2", l2))
           for s, p in (("q25", 0.25), ("median", 0.5), ("q75", 0.75))}
    out.update(auc=curve_auc(g, success_curve(li, g)), n_fooled_within_cap=int(np.isfinite(li).sum()),
               n_clean_correct=int(cc.sum()))
    ex = None if min_exact is None else np.asarray(pd.to_numeric(pd.Series(min_exact), errors="coerce"),
                                                     dtype=float)[cc]
    if ex is None or np.isnan(ex).any() or not cc.any():
        out.update(n_upper_bound=float("nan"), frac_upper_bound=float("nan"))
    else:
        ub = int((ex == 0).sum())
        out.update(n_upper_bound=ub, frac_upper_bound=ub / int(cc.sum()))
    return out


# --- run folders --------------------------------------------------------------------------------

def _measured(df: pd.DataFrame, victim: str, spec: str) -> bool:
    """Every row of ``victim`` measured by this search with these parameters (``spec``)."""
    if "min_search" not in df.columns or "queries" not in df.columns:
        return False
    rows = df[df["victim"] == victim]
    return len(rows) > 0 and bool(rows["queries"].notna().all()) and bool((rows["min_search"] == spec).all())


class ModelCache:
    """Loads each (model, zoo size) of a run once (member 0, eval mode, on ``device``)."""

    def __init__(self, cache, device: str) -> None:
        self.cache, self.device, self._m = cache, device, {}

    def get(self, name: str, size: str) -> nn.Module:
        key = (name, size)
        if key not in self._m:
            from ...models import zoo

            self._m[key] = zoo.load_model(name, size, self.cache, self.device, member=0)
        return self._m[key]


def cell_images(run_dir: str | Path, cell_id: str, manifest: dict, data_dir=None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(x, x_adv, y, target or None, index) of a cached cell: clean images (pixels in [0, 1]) taken
    from the run's evaluation images (:meth:`RunSpec.eval_images` of the ``manifest``) by the cached
    dataset indices, which must lie among them."""
    from ...grid.runspec import RunSpec
    from ...run.store import RunStore

    store = RunStore(run_dir)
    cached = store.load_adv(cell_id)
    if cached is None and store.is_packed(cell_id):
        raise UserError(f"cell {cell_id} of {run_dir} was packed without its examples (advtransfer pack); measure "
                        "the run folder that has them, or craft them again in a copy of the pack with its adv/"
                        f"{cell_id}.packed deleted")
    if cached is None:
        raise UserError(f"cell {cell_id} has no cached examples in {run_dir}/adv; rerun the grid to craft them")
    t, _meta = cached
    x_all, y_all, idx_all = RunSpec.from_manifest(manifest).eval_images(data_dir)
    pos = {int(i): k for k, i in enumerate(idx_all.tolist())}
    try:
        rows = torch.tensor([pos[int(i)] for i in t["index"].tolist()], dtype=torch.int64)
    except KeyError:
        raise UserError(f"cell {cell_id} holds images outside the grid's subset; the manifest does not match adv/") from None
    return x_all[rows], t["x_adv"].float(), y_all[rows], t.get("target"), t["index"]


def measure_run(run_dir: str | Path, victims: Iterable[str] | None = None, cap: float = DEFAULT_CAP,
                rel_tol: float = DEFAULT_REL_TOL, abs_tol: float = DEFAULT_ABS_TOL, device: str = "cpu",
                cache=None, data_dir=None, batch_size: int = 500,
                log: Callable[[str], None] = lambda s: None, scan_per_unit: int = DEFAULT_SCAN_PER_UNIT) -> pd.DataFrame:
    """Measure minimal distortion for every (cell, victim) of a run; returns the summary table.

    Per image, ``min_scale, min_linf, min_l2, min_exact, queries`` and ``min_search``
    (:func:`search_spec`) are merged into ``RUN/samples/<cell_id>.parquet`` (written atomically;
    (cell, victim) pairs already measured by this search with these parameters are skipped, so
    rerunning costs nothing; pairs measured by an older search, e.g. before ``min_exact`` existed,
    or with another cap, tolerance or scan are measured again). ``victims``: restrict to these
    (default: every victim of the results table). The summary, one row per (cell, victim) with the
    columns of :func:`summarize` plus cell_id, victim, surrogate, attack_label, eps, eps_str,
    targeted, is_whitebox, mean_queries, is written to ``RUN/distortion.parquet`` and ``.csv``.
    """
    run_dir = Path(run_dir)
    res, manifest = run_context(run_dir)
    known = set(res["victim"])
    wanted = list(dict.fromkeys(victims)) if victims else sorted(known)
    unknown = [v for v in wanted if v not in known]
    if unknown:
        raise UserError(f"victim(s) {', '.join(unknown)} not in this run's results (it has: {', '.join(sorted(known))})")
    spec = search_spec(cap, rel_tol, abs_tol, scan_per_unit)
    models = ModelCache(cache, device)
    store = RunStore(run_dir)
    for cell_id, rows in res.groupby("cell_id", sort=False):
        df = store.read_samples(cell_id, required=True)
        todo = [v for v in rows["victim"] if v in wanted and not _measured(df, v, spec)]
        if not todo:
            continue
        x, x_adv, y, target, index = cell_images(run_dir, cell_id, manifest, data_dir)
        targeted = bool(rows["targeted"].iloc[0])
        goal = target if (targeted and target is not None) else y
        for col in MEASURED_COLUMNS:
            if col not in df.columns:
                df[col] = pd.Series(np.nan, index=df.index, dtype="float64")
        if "min_search" not in df.columns:
            df["min_search"] = pd.Series("", index=df.index, dtype=object)
        df["min_search"] = df["min_search"].astype(object).where(df["min_search"].notna(), "")
        for v in todo:
            size = str(rows.loc[rows["victim"] == v, "zoo_size"].iloc[0])
            log(f"minimal distortion: cell {cell_id} victim {v} ({len(x)} images)")
            model = models.get(v, size)
            lm = getattr(model, "label_map", None)  # a downstream victim: its own labels (never targeted)
            out = min_scale_search(model, x, x_adv, lm[goal] if lm is not None else goal, targeted, cap, rel_tol,
                                   abs_tol, batch_size, device, scan_per_unit=scan_per_unit)
            m = pd.DataFrame({"index": index.numpy(), **{k: out[k].numpy().astype(float) for k in MEASURED_COLUMNS}})
            sel = df["victim"] == v
            merged = df.loc[sel, ["index"]].merge(m, on="index", how="left")
            for col in MEASURED_COLUMNS:
                df.loc[sel, col] = merged[col].to_numpy(dtype=float)
            df.loc[sel, "min_search"] = np.where(merged["queries"].notna().to_numpy(), spec, "")
        store.replace_samples(cell_id, df)
    return write_summary(run_dir, res)


def write_summary(run_dir: str | Path, res: pd.DataFrame | None = None, r_max: float = DEFAULT_R_MAX) -> pd.DataFrame:
    """Summarise every measured (cell, victim) of the samples into RUN/distortion.parquet/.csv."""
    run_dir = Path(run_dir)
    if res is None:
        res, _ = run_context(run_dir)
    s = read_samples(run_dir)
    cols = ["cell_id", "victim", "surrogate", "attack_label", "eps", "eps_str", "targeted", "is_whitebox"]
    rows = []
    if len(s) and "min_linf" in s.columns:
        s = s[s["queries"].notna()]
        meta = res.set_index(["cell_id", "victim"])
        for (cid, v), g in s.groupby(["cell_id", "victim"], sort=False):
            if (cid, v) not in meta.index:
                continue
            r = meta.loc[(cid, v)]
            rows.append({"cell_id": cid, "victim": v, **{c: r[c] for c in cols[2:]},
                         **summarize(g["min_linf"], g["min_l2"], g["clean_correct"], r_max,
                                     g["min_exact"] if "min_exact" in g.columns else None),
                         "mean_queries": float(g["queries"].mean())})
    out = pd.DataFrame(rows, columns=None if rows else cols)
    if len(out):
        out = out.sort_values(["surrogate", "attack_label", "eps", "victim"], kind="stable").reset_index(drop=True)
    with atomic_path(run_dir / "distortion.parquet") as tmp:
        out.to_parquet(tmp, index=False)
    with atomic_path(run_dir / "distortion.csv") as tmp:
        out.to_csv(tmp, index=False)
    return out


__all__ = ["min_scale_search", "success_curve", "curve_auc", "summarize", "measure_run", "write_summary",
           "cell_images", "linf_grid", "scan_grid", "search_spec", "DEFAULT_CAP", "DEFAULT_REL_TOL",
           "DEFAULT_ABS_TOL", "DEFAULT_SCAN_PER_UNIT", "SEARCH_VERSION"]
