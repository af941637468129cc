"""``advtransfer whitebox-match RUN --ladder LADDER``: transfer of attacks against a data-space
baseline at equal white-box success."""
from __future__ import annotations

import argparse

from ..core.errors import UserError
from ..analysis.runs import check_out_dir, write_tables
from .printing import print_rates


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("whitebox-match", help="transfer of attacks compared with a data-space baseline at equal "
                                              "white-box success (the baseline run at a ladder of eps)",
                       description="For each single-model surrogate and victim: the attack's transfer ASR minus the "
                                   "baseline's transfer read off its eps ladder (LADDER run) at the white-box ASR the "
                                   "attack reached on its own surrogate; image-bootstrap intervals with the matching "
                                   "redone per resample. Writes whitebox_match.csv and whitebox_match_pooled.csv.")
    p.add_argument("run_dir", metavar="RUN", help="run with the attacks (each surrogate also a victim)")
    p.add_argument("--ladder", required=True, metavar="LADDER", help="run of the baseline at several eps "
                                                                       "(grids/repr-vs-data.yaml)")
    p.add_argument("--attack", required=True, help="comma-separated attack labels of RUN")
    p.add_argument("--baseline", default="mifgsm", help="attack label of the ladder (default mifgsm)")
    p.add_argument("--out", metavar="DIR", help="folder for the tables (default: RUN)")


def run(args: argparse.Namespace) -> int:
    from ..analysis.measures.whitebox_match import matched_whitebox

    check_out_dir(args.out)
    attacks = [a.strip() for a in args.attack.split(",") if a.strip()]
    per, pooled = matched_whitebox(args.run_dir, args.ladder, attacks, args.baseline)
    if per.empty:
        raise UserError("no surrogate has both a white-box row in RUN and a ladder with it as victim in LADDER")
    paths = write_tables({"whitebox_match": per, "whitebox_match_pooled": pooled}, args.out or args.run_dir)
    cols = ["attack", "surrogate", "victim", "whitebox_attack", "asr_attack", "eps_matched", "asr_matched", "diff",
            "diff_ci_low", "diff_ci_high", "asr_same_eps"]
    print(f"transfer at equal white-box success; matched: {args.baseline} on its eps ladder (eps_matched in /255)")
    print_rates(per, cols)
    print("\nmean over the victims of each surrogate (points)")
    print_rates(pooled, ["attack", "surrogate", "n_victims", "whitebox_attack", "whitebox_ladder_max", "eps_matched", "diff",
                         "diff_ci_low", "diff_ci_high", "n_victims_worse"])
    print(f"\ntables: {paths[0]} and {paths[1]}")
    return 0
