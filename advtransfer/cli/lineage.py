"""``advtransfer lineage RUN``: ASR by how the victim descends from the surrogate, with paired contrasts."""
from __future__ import annotations

import argparse

from ..analysis.runs import check_out_dir
from .common import run_table_args
from .printing import write_and_print


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lineage", help="ASR by how the victim descends from the surrogate (itself, its adapted or "
                                       "fine-tuned descendant, another lineage, scratch) with paired contrasts",
                       description="Group rows by victim recipe and its relation to the surrogate through init_from "
                                   "chains; contrast own descendants with the same recipe descended from another "
                                   "replicate of the source and with models trained from scratch on the same data; "
                                   "writes lineage_groups.csv and lineage_contrasts.csv.")
    run_table_args(p)


def run(args: argparse.Namespace) -> int:
    from ..analysis.measures.mismatch import lineage_table

    check_out_dir(args.out)
    groups, contrasts = lineage_table(args.run_dir, args.attack)
    return write_and_print({
        "lineage_groups": (groups, "", ["attack_label", "victim_recipe", "relation", "victim_data", "n_rows",
                                        "clean_acc", "asr", "asr_ci_low", "asr_ci_high"]),
        "lineage_contrasts": (contrasts, "own descendant vs controls (points)",
                              ["attack_label", "descendant", "vs", "control", "asr_descendant", "asr_control", "diff",
                               "diff_ci_low", "diff_ci_high"])}, args.out, args.run_dir)
