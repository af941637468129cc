"""``advtransfer dumb RUN``: DUMB's mismatch table of a run (source, architecture, class balance)."""
from __future__ import annotations

import argparse

from ..analysis.runs import check_out_dir
from .common import run_table_args
from .printing import write_and_print


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dumb", help="DUMB's table of a run: ASR per source/architecture/balance mismatch case, "
                                    "with intervals, and the paired cost of each mismatch",
                       description="Classify every (surrogate, victim) row by whether the two models match in "
                                   "dataset source, architecture and class balance (DUMB); pool each case's ASR "
                                   "with an image-bootstrap interval; writes dumb_cases.csv and dumb_costs.csv.")
    run_table_args(p)


def run(args: argparse.Namespace) -> int:
    from ..analysis.measures.mismatch import dumb_table

    check_out_dir(args.out)
    cases, costs = dumb_table(args.run_dir, args.attack)
    return write_and_print({
        "dumb_cases": (cases, "ASR (%) per case; interval: image bootstrap; range: per model pair",
                       ["attack_label", "source", "arch", "balance", "n_pairs", "asr", "asr_ci_low", "asr_ci_high",
                        "pair_asr_min", "pair_asr_max"]),
        "dumb_costs": (costs, "cost of a mismatch (points): ASR(only that axis differs) - ASR(all match)",
                       ["attack_label", "axis", "n_pairs_mismatch", "asr_match", "asr_mismatch", "diff", "diff_ci_low",
                        "diff_ci_high", "n_drop", "n_surrogates", "p_sign"])}, args.out, args.run_dir)
