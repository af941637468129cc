"""Transfer at equal white-box success: is an attack's lower transfer more than its lower white-box
success?

A representation-space attack (``repr_push``, ``dta``) at ε fools its own surrogate less often than
MI-FGSM at the same ε, so comparing their transfer at equal ε mixes two things. Here the data-space
baseline is run at a ladder of radii (``grids/repr-vs-data.yaml``: MI-FGSM at 1/255 … 8/255 on the
same surrogates, images and victims) and, for each surrogate and victim, its transfer ASR is read
off the ladder at the white-box ASR the other attack reached, by linear interpolation of
(white-box ASR, transfer ASR) over the radii. The difference (attack − matched baseline) is
negative when the attack transfers worse than a data-space attack that fools the surrogate
equally often.

The ladder is made monotone before interpolating (a running maximum over increasing ε of both
white-box and transfer ASR: more budget never fools fewer images, so a dip is noise); where several
radii reach the same white-box level (a saturated ladder) the smallest is the match, the weakest
data-space attack that fools the surrogate as often; a white-box level outside the ladder's range
gives no match (NaN), never an extrapolation.

Intervals: a percentile bootstrap over the test images (one resample of the images shared by every
row of both runs, 2,000 resamples, seeded), the matching redone in every resample, so the
interval includes the uncertainty of the white-box level and of the ladder. It does not capture
model-to-model variation: each surrogate is one trained model.

The two runs are paired by model name, so both must have evaluated the same weights under every
name they share (``surrogate_sha``, ``victim_sha``): a ladder run on a retrained zoo (another
machine's cpu zoo, say) is refused with one line rather than matched against the wrong models.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ...core.errors import UserError
from .. import pooling
from ..pooling import N_BOOT
from ..runs import read_results


def _interp(w_a: np.ndarray, w: np.ndarray, t: np.ndarray, eps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per resample b: the transfer ASR and ε on the ladder (w[b, k], t[b, k] over increasing ε_k)
    at white-box level w_a[b]; NaN where w_a[b] lies outside [w[b, 0], w[b, -1]] of the monotone ladder."""
    w = np.maximum.accumulate(np.nan_to_num(w, nan=-1.0), axis=1)
    t = np.maximum.accumulate(np.nan_to_num(t, nan=-1.0), axis=1)
    out_t, out_e = np.full(len(w_a), np.nan), np.full(len(w_a), np.nan)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(w_a) & (w_a >= w[:, 0]) & (w_a <= w[:, -1]) & (w[:, 0] >= 0)
    if not ok.any():
        return out_t, out_e
    # np.interp per resample, vectorised: of several radii with the same white-box level (a
    # saturated ladder: 100% from some eps on) the smallest counts, the weakest attack that fools
    # the surrogate as often. j: the first radius at or above the level; where it is above, the
    # segment starts at the first radius of the level just below (what np.interp sees once equal
    # levels are dropped), and the value is np.interp's slope * (x - x_i) + y_i.
    rows = np.flatnonzero(ok)
    wr, tr, x = w[rows], t[rows], w_a[rows]
    K = w.shape[1]
    j = np.minimum((wr < x[:, None]).sum(1), K - 1)
    first = np.argmax(wr == wr[np.arange(len(rows)), np.maximum(j - 1, 0)][:, None], axis=1)
    exact = wr[np.arange(len(rows)), j] == x
    i = np.where(exact, j, first)
    xi, xj = wr[np.arange(len(rows)), i], wr[np.arange(len(rows)), j]
    for vals, out in ((tr, out_t), (np.broadcast_to(eps, wr.shape), out_e)):
        yi, yj = vals[np.arange(len(rows)), i], vals[np.arange(len(rows)), j]
        with np.errstate(invalid="ignore", divide="ignore"):
            slope = (yj - yi) / (xj - xi)
            out[rows] = np.where(exact, yj, slope * (x - xi) + yi)
    return out_t, out_e


def model_shas(df: pd.DataFrame) -> dict[str, set[str]]:
    """Model name → the sha256s of its weights in ``df``'s rows (single-model surrogates and
    victims; a run from before the sha columns gives an empty map)."""
    out: dict[str, set[str]] = {}
    for name, sha in (("surrogate", "surrogate_sha"), ("victim", "victim_sha")):
        if sha in df.columns:
            for m, h in zip(df[name].astype(str), df[sha]):
                if isinstance(h, str) and h:
                    out.setdefault(m, set()).add(h)
    return out


def check_same_weights(a: pd.DataFrame, b: pd.DataFrame, where_a: str | Path, where_b: str | Path) -> None:
    """One-line :class:`UserError` when rows of ``a`` and ``b`` (two runs about to be paired by model
    name) hold different weights under one name, or one run several weights under one name."""
    sa, sb = model_shas(a), model_shas(b)
    for m in sorted(set(sa) | set(sb)):
        ha, hb = sa.get(m, set()), sb.get(m, set())
        if len(ha) > 1 or len(hb) > 1 or (ha and hb and ha != hb):
            short = lambda h: "+".join(sorted(x[:12] for x in h)) or "none"  # noqa: E731
            raise UserError(f"{where_a} and {where_b} evaluated different weights of {m} ({short(ha)} vs "
                            f"{short(hb)}), so pairing them by name would compare other models; run both "
                            "grids on the same trained zoo into fresh folders")


def _read(run_dir: str | Path) -> pd.DataFrame:
    res = read_results(run_dir)
    return res[(res["match"] == "none") & (res["n_surrogates"] == 1)]


@dataclass
class MatchedPair:
    """One (attack, surrogate, victim) of :func:`matched_pairs`: point values (fractions, ε in
    [0, 1]) and the ``N_BOOT`` resampled differences ``boot_diff`` (NaN where a resample's
    white-box level fell outside the ladder)."""

    attack: str
    surrogate: str
    victim: str
    eps: float
    whitebox_attack: float
    whitebox_ladder_max: float
    asr_attack: float
    asr_matched: float
    eps_matched: float
    asr_same_eps: float
    grad_evals_attack: float
    grad_evals_matched: float
    n_images: int
    boot_diff: np.ndarray

    @property
    def diff(self) -> float:
        return self.asr_attack - self.asr_matched


def _attack_rows(res: pd.DataFrame, attacks: list[str], eps: float | None, surrogates: tuple[str, ...] | None,
                 run_dir: str | Path) -> pd.DataFrame:
    """The rows of ``attacks`` in the run's single-model rows ``res``, at ``eps`` (pixel units) and
    on ``surrogates`` (names or replicate bases) where given; UserError naming what is missing."""
    unknown = [a for a in attacks if a not in set(res["attack_label"])]
    if unknown:
        raise UserError(f"{run_dir}: no rows of attack {', '.join(unknown)}; "
                        f"its attacks are {', '.join(sorted(set(res['attack_label'])))}")
    res = res[res["attack_label"].isin(attacks)]
    if eps is not None:
        res = res[np.isclose(res["eps"].astype(float), eps, rtol=0, atol=1e-9)]
    if surrogates is not None:
        res = res[res["surrogate"].isin(surrogates) | res["surrogate_base"].isin(surrogates)]  # a base: its replicates
    if res.empty:
        raise UserError(f"{run_dir}: no single-model rows of attack {', '.join(attacks)}"
                        + (f" at eps {eps * 255:.4g}/255" if eps is not None else "")
                        + (f" on surrogates {', '.join(surrogates)}" if surrogates is not None else "")
                        + "; run the attack's grid at that eps into it")
    return res


class _SharedImages:
    """The per-image flags of both runs on the test images they share, and one seeded bootstrap
    draw over those images (``N_BOOT`` resamples) that every pair uses."""

    def __init__(self, run_dir: str | Path, res: pd.DataFrame, ladder_dir: str | Path, lad: pd.DataFrame,
                 seed: int) -> None:
        self.img_a, self.img_l = pooling.Images(run_dir, res), pooling.Images(ladder_dir, lad)
        self.common = np.intersect1d(self.img_a.index, self.img_l.index)
        if len(self.common) == 0:
            raise UserError("the two runs share no test image; run the ladder on the same images (n, start)")
        self.W = pooling.boot_weights(len(self.common), seed)
        self.pos_a = np.searchsorted(self.img_a.index, self.common)
        self.pos_l = np.searchsorted(self.img_l.index, self.common)

    def attack(self, cell_id: str, victim: str) -> tuple:
        """Pooled ASR of a row of the attack's run on the shared images (:func:`pooling.pooled`)."""
        s, c = self.img_a.row(cell_id, victim)
        return pooling.pooled(s[self.pos_a], c[self.pos_a], self.W)

    def ladder(self, cell_id: str, victim: str) -> tuple:
        """Pooled ASR of a row of the ladder run on the shared images (:func:`pooling.pooled`)."""
        s, c = self.img_l.row(cell_id, victim)
        return pooling.pooled(s[self.pos_l], c[self.pos_l], self.W)


def _by_eps(rows: pd.DataFrame) -> dict[float, tuple[str, str]]:
    """eps -> (cell_id, victim) of the first of ``rows`` at that radius (a lookup per radius
    instead of a pandas filter: this loop dominated ``make claims``)."""
    return dict(zip(rows["eps"].iloc[::-1], zip(rows["cell_id"].iloc[::-1], rows["victim"].iloc[::-1])))


def _surrogate_pairs(atk: str, sur: str, sub: pd.DataFrame, ls: pd.DataFrame, images: _SharedImages,
                     victims: tuple[str, ...] | None) -> list[MatchedPair]:
    """The pairs of attack ``atk`` on surrogate ``sur`` (its rows ``sub``) against the ladder's
    rows ``ls`` on that surrogate, one per held-out victim (sorted by name) the ladder evaluated
    at every radius; none without a white-box row or a ladder of two white-box radii."""
    wb = sub[sub["victim"] == sur]
    if wb.empty or ls.empty or (ls["victim"] == sur).sum() < 2:
        return []
    radii = np.array(sorted(ls["eps"].unique()))
    w_a = images.attack(wb["cell_id"].iloc[0], wb["victim"].iloc[0])
    at = _by_eps(ls[ls["victim"] == sur])
    ladder_w = [images.ladder(*at[e]) for e in radii]
    wl = np.stack([p[3] for p in ladder_w], 1)
    wl0 = np.array([[p[0] for p in ladder_w]])
    # held out: neither the surrogate nor another replicate of it (resnet20_a@r1 for resnet20_a)
    held_out = sub[sub["victim"].map(lambda v: str(v).partition("@r")[0]) != str(sur).partition("@r")[0]]
    if victims is not None:
        held_out = held_out[held_out["victim"].isin(victims)]
    out: list[MatchedPair] = []
    for _, r in held_out.sort_values("victim").iterrows():
        v = r["victim"]
        lv = ls[ls["victim"] == v]
        if len(lv) != len(radii):
            continue
        a = images.attack(r["cell_id"], v)
        at = _by_eps(lv)
        ladder_t = [images.ladder(*at[e]) for e in radii]
        tl = np.stack([p[3] for p in ladder_t], 1)
        t0, e0 = _interp(np.array([w_a[0]]), wl0, np.array([[p[0] for p in ladder_t]]), radii)
        tb, _ = _interp(w_a[3], wl, tl, radii)
        same = lv[np.isclose(lv["eps"], r["eps"])]
        out.append(MatchedPair(
            attack=atk, surrogate=sur, victim=v, eps=float(r["eps"]), whitebox_attack=w_a[0],
            whitebox_ladder_max=float(wl0.max()), asr_attack=a[0], asr_matched=float(t0[0]),
            eps_matched=float(e0[0]), asr_same_eps=float(same["asr"].iloc[0]) if len(same) else np.nan,
            grad_evals_attack=float(r["grad_evals"]), grad_evals_matched=_interp_evals(lv, radii, float(e0[0])),
            n_images=len(images.common), boot_diff=a[3] - tb))
    return out


def matched_pairs(run_dir: str | Path, ladder_dir: str | Path, attacks: list[str], baseline: str = "mifgsm",
                  seed: int = 0, eps: float | None = None, surrogates: tuple[str, ...] | None = None,
                  victims: tuple[str, ...] | None = None) -> list[MatchedPair]:
    """Every (attack, surrogate, held-out victim: neither the surrogate nor a replicate of it) of
    ``run_dir`` matched on ``ladder_dir``'s ``baseline`` ladder at the attack's white-box ASR (see
    the module docstring), sorted by attack, surrogate and victim; ``eps`` (pixel units),
    ``surrogates`` (names or replicate bases) and ``victims`` restrict the attack's rows. A
    surrogate without a white-box row or a ladder of at least two radii (with its white-box rows)
    is left out, and so is a victim the ladder did not evaluate at every radius. The resamples of
    the test images are one seeded draw shared by every pair, so pairs can be pooled resample by
    resample."""
    res, lad = _read(run_dir), _read(ladder_dir)
    lad = lad[lad["attack_label"] == baseline]
    if lad.empty:
        raise UserError(f"{ladder_dir}: no {baseline} rows; run the ladder grid (grids/repr-vs-data.yaml) into it")
    res = _attack_rows(res, attacks, eps, surrogates, run_dir)
    check_same_weights(res, lad[lad["surrogate"].isin(set(res["surrogate"]))], run_dir, ladder_dir)
    images = _SharedImages(run_dir, res, ladder_dir, lad, seed)
    return [pair for (atk, sur), sub in res.groupby(["attack_label", "surrogate"], sort=True)
            for pair in _surrogate_pairs(atk, sur, sub, lad[lad["surrogate"] == sur], images, victims)]


def _interp_evals(lv: pd.DataFrame, radii: np.ndarray, eps: float) -> float:
    """The ladder's gradient evaluations per image at the matched radius (they are the same at
    every radius of an MI-FGSM ladder; interpolated in case a ladder's schedule differs)."""
    if not np.isfinite(eps):
        return float("nan")
    ge = [float(lv.loc[lv["eps"] == e, "grad_evals"].iloc[0]) for e in radii]
    return float(np.interp(eps, radii, ge))


def bootstrap_interval(d: np.ndarray) -> tuple[float, float]:  # also the claims table's (by: whitebox)
    """95% percentile interval of resampled differences; NaN when over 10% of resamples had no
    match (the white-box level too near an end of the ladder to say)."""
    ok = np.isfinite(d)
    if ok.sum() < 0.9 * N_BOOT:
        return float("nan"), float("nan")
    lo, hi = np.percentile(d[ok], [2.5, 97.5])
    return float(lo), float(hi)


def matched_whitebox(run_dir: str | Path, ladder_dir: str | Path, attacks: list[str],
                     baseline: str = "mifgsm", seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-victim table, per-(attack, surrogate) table pooled over the victims).

    ``run_dir``: a run with ``attacks`` (labels) on single-model surrogates, each surrogate also a
    victim (its white-box row); ``ladder_dir``: a run with ``baseline`` at several ε on the same
    surrogates, images and victims. Columns: attack, surrogate, victim, whitebox_attack (the
    attack's white-box ASR), asr_attack (its transfer), eps_matched (the ladder's ε at that
    white-box level, in /255), asr_matched (the baseline's transfer there), diff = asr_attack −
    asr_matched with diff_ci_low/high; asr_same_eps (the baseline at the attack's own ε, for reference)."""
    pairs = matched_pairs(run_dir, ladder_dir, attacks, baseline, seed)
    rows = []
    for p in pairs:
        lo, hi = bootstrap_interval(p.boot_diff)
        rows.append({"attack": p.attack, "surrogate": p.surrogate, "victim": p.victim, "eps": p.eps,
                     "whitebox_attack": p.whitebox_attack, "asr_attack": p.asr_attack,
                     "eps_matched": p.eps_matched * 255, "asr_matched": p.asr_matched, "diff": p.diff,
                     "diff_ci_low": lo, "diff_ci_high": hi, "asr_same_eps": p.asr_same_eps})
    pooled_rows = []
    by: dict[tuple[str, str], list[MatchedPair]] = {}
    for p in pairs:
        by.setdefault((p.attack, p.surrogate), []).append(p)
    for (atk, sur), ps in by.items():
        lo, hi = bootstrap_interval(np.mean(np.stack([p.boot_diff for p in ps]), 0))
        diffs0 = [p.diff for p in ps]
        pooled_rows.append({"attack": atk, "surrogate": sur, "n_victims": len(ps), "whitebox_attack": ps[0].whitebox_attack,
                            "whitebox_ladder_max": ps[0].whitebox_ladder_max, "eps_matched": ps[-1].eps_matched * 255,
                            "diff": float(np.mean(diffs0)), "diff_ci_low": lo, "diff_ci_high": hi,
                            "n_victims_worse": int(sum(x < 0 for x in diffs0))})
    return pd.DataFrame(rows), pd.DataFrame(pooled_rows)
