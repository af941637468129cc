"""The verdicts of a comparison table (``RUN/comparisons.parquet``, one row per paired
comparison): which comparisons are on held-out victims, and one summary row per attack. Pure
pandas, shared by the report and the verdict figure; reads no file and loads no model."""
from __future__ import annotations

import pandas as pd


def held_out(cmp: pd.DataFrame, results: pd.DataFrame) -> pd.DataFrame:
    """The comparisons on held-out victims: those outside the row's surrogate set (a white-box
    pair, a surrogate evaluated as its own victim, is left out)."""
    sur = "surrogate_base" if "surrogate_base" in results.columns else "surrogate"
    white = set()
    if "is_whitebox" in results.columns:
        wb = results[results["is_whitebox"].astype(bool)]
        white = set(zip(wb[sur].astype(str), wb["victim"].astype(str)))
    keep = [(str(s), str(v)) not in white for s, v in zip(cmp["surrogate"], cmp["victim"])]
    return cmp[keep]


def attack_verdicts(held: pd.DataFrame) -> pd.DataFrame:
    """One row per attack A (``a_label``) over its held-out comparisons (every surrogate, ε,
    victim and matching): n, how many Holm-significant each way, the median difference in
    points and, per matching, the median difference (``median_by_match``: match -> points)."""
    rows = []
    for a, g in held[held["a_label"] != held["b_label"]].groupby("a_label", sort=True):
        d = 100 * g["diff"].astype(float)
        by = {str(m): float(100 * gg["diff"].astype(float).median()) for m, gg in g.groupby("match", sort=True)}
        better, worse = int((g["verdict"] == "a_better").sum()), int((g["verdict"] == "b_better").sum())
        rows.append({"attack": str(a), "n": len(g), "better": better, "worse": worse, "level": len(g) - better - worse,
                     "median_pts": float(d.median()), "median_by_match": by,
                     "surrogates": g["surrogate"].nunique(), "victims": g["victim"].nunique(),
                     "eps": ", ".join(dict.fromkeys(g.sort_values("eps")["eps_str"].astype(str))
                                      if "eps" in g.columns else g["eps_str"].astype(str).unique())})
    return pd.DataFrame(rows)
