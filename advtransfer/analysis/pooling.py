"""Image-pooled success rates and their image-bootstrap intervals (DUMB's cases, lineage,
white-box matching, the report's held-out and per-target tables).

A pooled ASR is Σ successes / Σ clean-correct images over the (cell, victim) rows of a group, a
fraction in [0, 1]. Its 95% interval is a percentile bootstrap over the *test images*: one
multinomial resample of the image axis (``N_BOOT`` resamples, seeded) shared by every row, so
images common to all rows are not counted as independent draws, and two pooled rates resampled
with the same weights give a paired interval of their difference.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

N_BOOT = 2000



class Images:
    """Per-image success and clean-correct flags of a run's rows on a common image axis (the
    sorted union of the test-image indices of the cells in ``res``)."""

    def __init__(self, run_dir: str | Path, res: pd.DataFrame) -> None:
        from ..run.store import RunStore

        self.store = RunStore(run_dir)
        self._cache: dict[str, pd.DataFrame] = {}
        self._rows: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
        ids = []
        for cid in res["cell_id"].unique():
            ids.append(self._cell(cid)["index"].to_numpy())
        self.index = np.unique(np.concatenate(ids)) if ids else np.zeros(0, dtype=np.int64)
        self.pos = {int(i): k for k, i in enumerate(self.index)}

    def _cell(self, cell_id: str) -> pd.DataFrame:
        if cell_id not in self._cache:
            self._cache[cell_id] = self.store.read_samples(cell_id, required=True)
        return self._cache[cell_id]

    def row(self, cell_id: str, victim: str) -> tuple[np.ndarray, np.ndarray]:
        """(success, clean_correct) as int arrays on the run's image axis (0 where not evaluated)."""
        victim = str(victim)
        if (cell_id, victim) not in self._rows:
            for v, df in self._cell(cell_id).groupby("victim", sort=False):  # every victim of the cell at once
                s, c = np.zeros(len(self.index), np.int64), np.zeros(len(self.index), np.int64)
                pos = np.searchsorted(self.index, df["index"].to_numpy())  # self.index: sorted, holds them all
                s[pos] = df["success"].to_numpy(dtype=bool)
                c[pos] = df["clean_correct"].to_numpy(dtype=bool)
                s.flags.writeable = c.flags.writeable = False
                self._rows[(cell_id, str(v))] = (s, c)
            if (cell_id, victim) not in self._rows:
                z = np.zeros(len(self.index), np.int64)
                z.flags.writeable = False
                self._rows[(cell_id, victim)] = (z, z)
        return self._rows[(cell_id, victim)]

    def summed(self, rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(successes, clean-correct) per image, summed over the (cell_id, victim) pairs of ``rows``."""
        S, C = np.zeros(len(self.index), np.int64), np.zeros(len(self.index), np.int64)
        for r in rows.itertuples():
            s, c = self.row(r.cell_id, r.victim)
            S, C = S + s, C + c
        return S, C


def boot_weights(n: int, seed: int = 0) -> np.ndarray:
    """``N_BOOT`` × n multinomial resampling counts of n images (seeded), float64."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=N_BOOT).astype(np.float64) if n else np.zeros((N_BOOT, 0))


def pooled(S: np.ndarray, C: np.ndarray, W: np.ndarray) -> tuple[float, float, float, np.ndarray]:
    """Pooled ASR ΣS/ΣC over images (a fraction) and its 95% bootstrap interval under the
    resampling weights ``W`` (from :func:`boot_weights`); also the B resampled values."""
    tot = C.sum()
    asr = S.sum() / tot if tot else float("nan")
    # one pass over W for both sums (sums of integers: exact in float64 in any order)
    num, den = (W @ np.stack([S, C], 1).astype(np.float64)).T
    with np.errstate(invalid="ignore", divide="ignore"):
        boots = np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)
    finite = np.isfinite(boots)
    lo, hi = (np.percentile(boots, [2.5, 97.5]) if finite.all()
              else np.nanpercentile(boots, [2.5, 97.5]) if finite.any() else (np.nan, np.nan))
    return float(asr), float(lo), float(hi), boots


def pooled_diff(a: tuple, b: tuple) -> dict:
    """Difference of two pooled ASRs (A − B, a fraction) with the 95% interval of the paired
    resamples: ``{'diff', 'diff_ci_low', 'diff_ci_high'}``; ``a`` and ``b`` as :func:`pooled` returns."""
    d = a[3] - b[3]
    ok = np.isfinite(d)
    lo, hi = np.percentile(d[ok], [2.5, 97.5]) if ok.any() else (np.nan, np.nan)
    return {"diff": a[0] - b[0], "diff_ci_low": float(lo), "diff_ci_high": float(hi)}
