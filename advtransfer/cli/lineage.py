"""``advtransfer lineage RUN``: ASR by how the victim descends from the surrogate, with paired contrasts."""
from __future__ import annotations

import argparse

from ..analysis.runs import check_out_dir, write_tables
from .printing import print_rates


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lineage", help="ASR by how the victim descends from the surrogate (itself, its adapted or "
                                       "fine-tuned descendant, another lineage, scratch) with paired contrasts",
                       description="Group rows by victim recipe and its relation to the surrogate through init_from "
                                   "chains; contrast own descendants with the same recipe descended from another "
                                   "replicate of the source and with models trained from scratch on the same data; "
                                   "writes lineage_groups.csv and lineage_contrasts.csv.")
    p.add_argument("run_dir", metavar="RUN")
    p.add_argument("--attack", help="comma-separated attack labels (default: all)")
    p.add_argument("--out", metavar="DIR", help="folder for the tables (default: RUN)")


def run(args: argparse.Namespace) -> int:
    from ..analysis.measures.mismatch import lineage_table

    check_out_dir(args.out)
    groups, contrasts = lineage_table(args.run_dir, args.attack)
    paths = write_tables({"lineage_groups": groups, "lineage_contrasts": contrasts}, args.out or args.run_dir)
    print_rates(groups, ["attack_label", "victim_recipe", "relation", "victim_data", "n_rows", "clean_acc", "asr",
                         "asr_ci_low", "asr_ci_high"])
    print("\nown descendant vs controls (points)")
    print_rates(contrasts, ["attack_label", "descendant", "vs", "control", "asr_descendant", "asr_control", "diff",
                            "diff_ci_low", "diff_ci_high"])
    print(f"\ntables: {paths[0]} and {paths[1]}")
    return 0
