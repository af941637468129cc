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


def fit_select(run_dir: str | Path, budgets: Sequence[int] = (10, 50, 200), pool: int = 500,
               device: str = "cpu", cache=None, data_dir=None, write: bool = True,
               log: Callable[[str], None] = lambda s: None) -> pd.DataFrame:
    """Replay FiT for every victim and ε of a run at each target budget Q; RUN/fit.parquet/.csv."""
    from ...grid.runspec import RunSpec
    from ...models import zoo
    from ..runs import run_context

    res, manifest = run_context(run_dir)
    s = joined_samples(run_dir)
    if "min_l2" not in s.columns or s["min_l2"].isna().all():
        raise UserError("FiT needs minimal distortion: run `advtransfer distortion` (measure_run) first")
    xh, yh, _ = RunSpec.from_manifest(manifest).held_out_images(pool, data_dir)
    if len(xh) < max(budgets):
        raise UserError(f"FiT needs {max(budgets)} held-out images after the run's subset; only {len(xh)} remain")
    size = str(res["zoo_size"].iloc[0])
    cache_m: dict[str, torch.Tensor] = {}

    def logits(name: str) -> torch.Tensor:
        if name not in cache_m:
            m = zoo.load_model(name, size, cache, device, member=0)
            with torch.no_grad():
                cache_m[name] = predict_batched(m, xh, 500, device)
        return cache_m[name]

    def set_pred(surrogate: str) -> np.ndarray:
        return torch.stack([logits(m) for m in surrogate.split("+")]).mean(0).argmax(1).numpy()

    rows = []
    yh_np = yh.numpy()
    for eps, se in s.groupby("eps", sort=True):
        for v in sorted(se["victim"].unique()):
            cells = se[(se["victim"] == v) & ~se["is_whitebox"].astype(bool)]
            sur = cells.groupby("cell_id")["surrogate"].first()
            if len(sur) < 2:
                continue
            cid = list(sur.index)
            log(f"FiT: victim {v}, eps {eps * 255:.0f}/255, {len(cid)} candidate cells")
            src_models = sorted({m for x in sur for m in x.split("+")})
            preds = np.stack([set_pred(sur[c]) for c in cid])
            ent = prediction_entropy(preds)
            order = np.argsort(-ent, kind="stable")
            v_err_all = set_pred(v) != yh_np
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
            cell_asr = succ[:, cc].mean(1) if cc.any() else np.full(len(cid), np.nan)
            cell_med = np.array([_median(mlinf[k, cc]) for k in range(len(cid))])
            best = min(range(len(cid)), key=lambda k: (-cell_asr[k], cell_med[k]))
            for q in budgets:
                top = order[:q]
                ms = np.array([nmi_errors(preds[k, top] != yh_np[top], v_err_all[top]) for k in range(len(cid))])
                ms = np.nan_to_num(ms, nan=0.0)
                with np.errstate(divide="ignore"):
                    score = (ms[:, None] + 1e-6) / tq                 # inf TransQ -> 0
                pick = score.argmax(0)
                cols = np.arange(len(idx))
                fs, fl = succ[pick, cols], mlinf[pick, cols]
                mode = Counter(pick[cc].tolist()).most_common(1)[0][0] if cc.any() else pick[0]
                rows.append({
                    "victim": v, "eps": float(eps), "eps_str": cells["eps_str"].iloc[0], "Q": int(q),
                    "queries_used": int(q), "n_candidates": len(cid), "n_clean_correct": int(cc.sum()),
                    "fit_source": f"{sur[cid[mode]]} / {cells[cells.cell_id == cid[mode]].attack_label.iloc[0]}",
                    "fit_share_mode": float((pick[cc] == mode).mean()) if cc.any() else float("nan"),
                    "fit_asr": float(fs[cc].mean()) if cc.any() else float("nan"),
                    "fit_median_min_linf": _median(fl[cc]),
                    "best_source": f"{sur[cid[best]]} / {cells[cells.cell_id == cid[best]].attack_label.iloc[0]}",
                    "best_asr": float(cell_asr[best]), "best_median_min_linf": float(cell_med[best]),
                    "random_asr": float(np.nanmean(cell_asr)),
                    "random_median_min_linf": float(np.mean(cell_med)) if np.isfinite(cell_med).all() else float("inf"),
                    "modsim_max": float(ms.max()),
                })
    out = pd.DataFrame(rows)
    if len(out):
        out["regret_asr"] = out["best_asr"] - out["fit_asr"]
    if write:
        write_table(out, run_dir, "fit")
    return out


__all__ = ["fit_select", "nmi_errors", "prediction_entropy"]
