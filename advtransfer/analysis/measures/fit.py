"""FiT source selection (Maho et al., "How to choose your best allies for a transferable attack?",
ICCV 2023; reference code github.com/t-maho/transferability_measure_fit), replayed on a run.

What FiT does (read from the authors' code, ``fit/fit.py``, ``fit/fbi.py``, ``fit/transq.py``):
the attacker owns several source models and may send a few queries to the target. Each candidate
source s gets a per-image score FiT(s, i) = ModSim(s, V) × TransQ(s, i) and image i is attacked
along the direction of the best-scoring source.

- ModSim (their "FBI"): pick the K images whose predictions disagree most across the sources
  (entropy of the sources' predicted labels), query the target once on each (K queries), and take
  the normalised mutual information between the error indicators e_s = 1(s(x) ≠ y) and
  e_V = 1(V(x) ≠ y):  NMI = I(e_s; e_V) / min(H(e_s), H(e_V)), clipped to [0, 1].
- TransQ (their method "1"): the mean, over the *other* sources used as proxy targets p, of the
  minimal L2 distortion along s's direction that fools p (a line search like
  :func:`advtransfer.analysis.distortion.min_scale_search`). No target query.

What we reproduce and simplify:
- the target budget Q is spent exactly as FiT spends it: Q = K clean-label queries to V on the Q
  highest-entropy images, taken from the test images *after* the run's subset (start + n onward;
  pool of ``pool`` images), so selection never sees the images it is scored on;
- source predictions for ModSim: the cell's surrogate set, members' logits averaged with equal
  weights (ensembles) — the grid's weights are ignored;
- TransQ uses the run's measured min_l2 of cell c against the other pool models that are also
  victims in the run (the attacker's proxies: models named among the pool's surrogates, never
  V and never c's own members), over the proxies that are right on the clean image (the released
  code scores a proxy already wrong on x with distortion 0). A cell or image with no proxy gets
  the mean TransQ of the pool (neutral);
- direction: the released code takes argmax of NMI × mean distortion, which would prefer sources
  whose directions need *more* distortion; we follow the paper's intent (high similarity, low
  distortion) with score = (NMI + 1e-6) / TransQ (TransQ = inf → score 0); NaN NMI (an error
  indicator constant over the K images) counts as 0;
- the pool at ε: the run's cells at that ε whose surrogate set does not contain V (transfer only).

Outcome per (victim, ε, Q): ``fit_asr`` = mean over V's clean-correct images of success of the
cell FiT picked for that image; ``fit_median_min_linf`` likewise; against ``best_*`` (the one cell
with the highest ASR on V, known only in hindsight; ties: smaller median min L∞) and ``random_*``
(expectation over a uniformly random cell of the pool: mean ASR, mean of the cells' median min L∞).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from ...core.errors import UserError
from ...core.metrics import predict_batched
from ...core.utils import write_table
from ..runs import joined_samples


def nmi_errors(e_s: np.ndarray, e_v: np.ndarray) -> float:
    """I(e_s; e_v) / min(H(e_s), H(e_v)) of two binary arrays (bits), clipped to [0, 1]; NaN when
    either is constant."""
    e_s, e_v = np.asarray(e_s, int), np.asarray(e_v, int)
    n = len(e_s)
    if n == 0:
        return float("nan")
    joint = np.zeros((2, 2))
    np.add.at(joint, (e_s, e_v), 1)
    joint /= n

    def h(p):
        p = p[p > 0]
        return float(-(p * np.log2(p)).sum())

    hs, hv, hj = h(joint.sum(1)), h(joint.sum(0)), h(joint.ravel())
    den = min(hs, hv)
    if den <= 0:
        return float("nan")
    return float(np.clip((hs + hv - hj) / den, 0, 1))


def prediction_entropy(preds: np.ndarray) -> np.ndarray:
    """Per image (columns of ``preds``, sources × images), entropy in bits of the label histogram."""
    out = []
    for col in np.asarray(preds).T:
        c = np.array(list(Counter(col.tolist()).values()), dtype=float) / len(col)
        out.append(float(-(c * np.log2(c)).sum()))
    return np.array(out)


def _median(v: np.ndarray) -> float:
    return float(np.quantile(v, 0.5, method="inverted_cdf")) if len(v) else float("nan")


class _HeldOutLabels:
    """Labels zoo models predict on FiT's held-out images (x: N×C×H×W, pixels in [0, 1]); each
    model's logits are computed once (batches of 500) and kept."""

    def __init__(self, x: torch.Tensor, size: str, cache, device: str) -> None:
        self.x, self.size, self.cache, self.device = x, size, cache, device
        self._logits: dict[str, torch.Tensor] = {}

    def logits(self, name: str) -> torch.Tensor:
        """Logits of model ``name`` (N × classes)."""
        from ...models import zoo

        if name not in self._logits:
            m = zoo.load_model(name, self.size, self.cache, self.device, member=0)
            with torch.no_grad():
                self._logits[name] = predict_batched(m, self.x, 500, self.device)
        return self._logits[name]

    def of_set(self, surrogate: str) -> np.ndarray:
        """Labels (N,) of a surrogate set ``a+b+...``: its members' logits averaged with equal weights."""
        return torch.stack([self.logits(m) for m in surrogate.split("+")]).mean(0).argmax(1).numpy()


@dataclass
class _Candidates:
    """The pool of one (victim, ε): its transfer cells and, per cell × image of the run (images in
    dataset-index order), TransQ (mean min L2 over the proxies, pixel units; the pool's mean where a
    cell has no proxy, at least 1e-12), success on the victim and min L∞ on the victim (pixel units)."""

    cells: pd.DataFrame      # per-image rows of the victim, transfer cells only
    sur: pd.Series           # cell_id -> surrogate set name
    cid: list[str]           # candidate cell ids, in the order of ``sur``
    idx: np.ndarray          # dataset indices of the images, sorted
    cc: np.ndarray           # bool per image: the victim is right on the clean image
    tq: np.ndarray           # cells × images
    succ: np.ndarray         # cells × images, bool
    mlinf: np.ndarray        # cells × images

    def source(self, k: int) -> str:
        """``surrogate / attack label`` of candidate ``k``."""
        c = self.cid[k]
        return f"{self.sur[c]} / {self.cells[self.cells.cell_id == c].attack_label.iloc[0]}"


def _candidates(se: pd.DataFrame, v: str) -> _Candidates | None:
    """The FiT pool against victim ``v`` from the per-image rows ``se`` of one ε (all victims):
    the cells whose surrogate set does not contain ``v``; None with fewer than two."""
    cells = se[(se["victim"] == v) & ~se["is_whitebox"].astype(bool)]
    sur = cells.groupby("cell_id")["surrogate"].first()
    if len(sur) < 2:
        return None
    cid = list(sur.index)
    src_models = sorted({m for x in sur for m in x.split("+")})
    # TransQ(c, i): mean min_l2 over proxies (other pool models that are victims in the run)
    g = cells.set_index(["cell_id", "index"])
    idx = np.sort(cells["index"].unique())
    cc = cells.groupby("index")["clean_correct"].first().reindex(idx).to_numpy(bool)
    tq = np.full((len(cid), len(idx)), np.nan)
    succ = np.zeros((len(cid), len(idx)), bool)
    mlinf = np.full((len(cid), len(idx)), np.inf)
    for k, c in enumerate(cid):
        own = set(sur[c].split("+"))
        proxies = [p for p in src_models if p not in own and p != v]
        # a proxy already wrong on x says nothing about the direction (min_l2 = 0): left out
        pr = se[(se["cell_id"] == c) & se["victim"].isin(proxies) & se["clean_correct"].astype(bool)]
        if len(pr):
            tq[k] = pr.groupby("index")["min_l2"].mean().reindex(idx).to_numpy(float)
        gc = g.loc[c]
        succ[k] = gc["success"].reindex(idx).to_numpy(bool)
        mlinf[k] = gc["min_linf"].reindex(idx).to_numpy(float)
    fill = np.nanmean(np.where(np.isfinite(tq), tq, np.nan)) if np.isfinite(tq).any() else 1.0
    tq = np.maximum(np.where(np.isnan(tq), fill, tq), 1e-12)
    return _Candidates(cells, sur, cid, idx, cc, tq, succ, mlinf)


def _budget_row(p: _Candidates, v: str, eps: float, q: int, preds: np.ndarray, order: np.ndarray,
                v_err_all: np.ndarray, yh_np: np.ndarray, cell_asr: np.ndarray, cell_med: np.ndarray,
                best: int) -> dict:
    """The outcome row of FiT against ``v`` at ε and target budget ``q`` (queries): ModSim from the
    ``q`` held-out images of highest source entropy (``order``), each image attacked by the cell of
    best score; against the best cell in hindsight (``best``) and a random cell."""
    cc = p.cc
    top = order[:q]
    ms = np.array([nmi_errors(preds[k, top] != yh_np[top], v_err_all[top]) for k in range(len(p.cid))])
    ms = np.nan_to_num(ms, nan=0.0)
    with np.errstate(divide="ignore"):
        score = (ms[:, None] + 1e-6) / p.tq                 # inf TransQ -> 0
    pick = score.argmax(0)
    cols = np.arange(len(p.idx))
    fs, fl = p.succ[pick, cols], p.mlinf[pick, cols]
    mode = Counter(pick[cc].tolist()).most_common(1)[0][0] if cc.any() else pick[0]
    return {
        "victim": v, "eps": float(eps), "eps_str": p.cells["eps_str"].iloc[0], "Q": int(q),
        "queries_used": int(q), "n_candidates": len(p.cid), "n_clean_correct": int(cc.sum()),
        "fit_source": p.source(mode),
        "fit_share_mode": float((pick[cc] == mode).mean()) if cc.any() else float("nan"),
        "fit_asr": float(fs[cc].mean()) if cc.any() else float("nan"),
        "fit_median_min_linf": _median(fl[cc]),
        "best_source": p.source(best),
        "best_asr": float(cell_asr[best]), "best_median_min_linf": float(cell_med[best]),
        "random_asr": float(np.nanmean(cell_asr)),
        "random_median_min_linf": float(np.mean(cell_med)) if np.isfinite(cell_med).all() else float("inf"),
        "modsim_max": float(ms.max()),
    }


def _victim_rows(se: pd.DataFrame, eps: float, v: str, labels: _HeldOutLabels, yh_np: np.ndarray,
                 budgets: Sequence[int], log: Callable[[str], None]) -> list[dict]:
    """FiT's rows against victim ``v`` at ε (pixel units), one per budget; none without a pool."""
    p = _candidates(se, v)
    if p is None:
        return []
    log(f"FiT: victim {v}, eps {eps * 255:.0f}/255, {len(p.cid)} candidate cells")
    preds = np.stack([labels.of_set(p.sur[c]) for c in p.cid])
    order = np.argsort(-prediction_entropy(preds), kind="stable")
    v_err_all = labels.of_set(v) != yh_np
    cell_asr = p.succ[:, p.cc].mean(1) if p.cc.any() else np.full(len(p.cid), np.nan)
    cell_med = np.array([_median(p.mlinf[k, p.cc]) for k in range(len(p.cid))])
    best = min(range(len(p.cid)), key=lambda k: (-cell_asr[k], cell_med[k]))
    return [_budget_row(p, v, eps, q, preds, order, v_err_all, yh_np, cell_asr, cell_med, best) for q in budgets]


def fit_select(run_dir: str | Path, budgets: Sequence[int] = (10, 50, 200), pool: int = 500,
               device: str = "cpu", cache=None, data_dir=None, write: bool = True,
               log: Callable[[str], None] = lambda s: None) -> pd.DataFrame:
    """Replay FiT for every victim and ε of a run at each target budget Q (queries); ``pool``: the
    held-out images after the run's subset it may query (at most); RUN/fit.parquet/.csv."""
    from ...grid.runspec import RunSpec
    from ..runs import run_context

    res, manifest = run_context(run_dir)
    s = joined_samples(run_dir)
    if "min_l2" not in s.columns or s["min_l2"].isna().all():
        raise UserError("FiT needs minimal distortion: run `advtransfer distortion` (measure_run) first")
    xh, yh, _ = RunSpec.from_manifest(manifest).held_out_images(pool, data_dir)
    if len(xh) < max(budgets):
        raise UserError(f"FiT needs {max(budgets)} held-out images after the run's subset; only {len(xh)} remain")
    labels = _HeldOutLabels(xh, str(res["zoo_size"].iloc[0]), cache, device)
    yh_np = yh.numpy()
    rows = [row for eps, se in s.groupby("eps", sort=True) for v in sorted(se["victim"].unique())
            for row in _victim_rows(se, eps, v, labels, yh_np, budgets, log)]
    out = pd.DataFrame(rows)
    if len(out):
        out["regret_asr"] = out["best_asr"] - out["fit_asr"]
    if write:
        write_table(out, run_dir, "fit")
    return out


__all__ = ["fit_select", "nmi_errors", "prediction_entropy"]
