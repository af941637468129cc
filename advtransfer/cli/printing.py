"""Printing the commands' tables: rate columns (fractions in [0, 1]) shown as percentages."""
from __future__ import annotations

import pandas as pd

from ..analysis.runs import format_pct

# rate columns of the mismatch, lineage and white-box-match tables, printed as percentages
PCT_COLUMNS = ["whitebox_attack", "asr_attack", "asr_matched", "asr_same_eps", "whitebox_ladder_max", "asr",
               "asr_ci_low", "asr_ci_high", "pair_asr_min", "pair_asr_max", "asr_match", "asr_mismatch", "diff",
               "diff_ci_low", "diff_ci_high", "asr_descendant", "asr_control", "clean_acc"]


def print_rates(df: pd.DataFrame, cols: list[str]) -> None:
    """Print the columns ``cols`` of ``df`` that it has, rates as percentages; '(no rows)' when empty."""
    if df.empty:
        print("(no rows)")
        return
    print(format_pct(df[[c for c in cols if c in df.columns]], PCT_COLUMNS).to_string(index=False))
