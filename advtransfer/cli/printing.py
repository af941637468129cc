"""Printing the commands' tables: rate columns (fractions in [0, 1]) shown as percentages."""
from __future__ import annotations

import pandas as pd

from ..analysis.runs import format_pct, write_tables

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


def write_and_print(tables: dict[str, tuple[pd.DataFrame, str, list[str]]], out: str | None, run_dir: str) -> int:
    """Write each table (name -> (frame, title, columns to print)) as ``<name>.csv`` under ``out``
    (default: the run folder), print each under its title, then the files written; returns 0."""
    paths = write_tables({name: df for name, (df, _, _) in tables.items()}, out or run_dir)
    for i, (df, title, cols) in enumerate(tables.values()):
        if title:
            print(("\n" if i else "") + title)
        print_rates(df, cols)
    print(f"\ntables: {' and '.join(str(p) for p in paths)}")
    return 0
