"""``advtransfer dumb RUN``, ``advtransfer lineage RUN`` and ``advtransfer knowledge``: when
surrogate and victim differ in data, balance, architecture or lineage (registered in
:mod:`advtransfer.cli`)."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UserError

_PCT = ["whitebox_attack", "asr_attack", "asr_matched", "asr_same_eps", "whitebox_ladder_max", "asr", "asr_ci_low", "asr_ci_high", "pair_asr_min", "pair_asr_max", "asr_match", "asr_mismatch", "diff",
        "diff_ci_low", "diff_ci_high", "asr_descendant", "asr_control", "clean_acc"]


def add_mismatch_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dumb", help="DUMB's table of a run: ASR per source/architecture/balance mismatch case, "
                                    "with intervals, and the paired cost of each mismatch",
                       description="Classify every (surrogate, victim) row by whether the two models match in "
                                   "dataset source, architecture and class balance (DUMB); pool each case's ASR "
                                   "with an image-bootstrap interval; writes dumb_cases.csv and dumb_costs.csv.")
    p.add_argument("run_dir", metavar="RUN")
    p.add_argument("--attack", help="comma-separated attack labels (default: all)")
    p.add_argument("--out", metavar="DIR", help="folder for the tables (default: RUN)")
    p = sub.add_parser("lineage", help="ASR by how the victim descends from the surrogate (itself, its adapted or "
                                       "fine-tuned descendant, another lineage, scratch) with paired contrasts",
                       description="Group rows by victim recipe and its relation to the surrogate through init_from "
                                   "chains; contrast own descendants with the same recipe descended from another "
                                   "replicate of the source and with models trained from scratch on the same data; "
                                   "writes lineage_groups.csv and lineage_contrasts.csv.")
    p.add_argument("run_dir", metavar="RUN")
    p.add_argument("--attack", help="comma-separated attack labels (default: all)")
    p.add_argument("--out", metavar="DIR", help="folder for the tables (default: RUN)")
    p = sub.add_parser("knowledge", help="adversarial-transferability metrics (alpha1, alpha2) of each source -> "
                                         "fine-tuned descendant beside the fine-tuning gain, and their correlation",
                       description="Liang et al.'s metrics on trained zoo models: for each descendant (an entry "
                                   "with init_from) and its source, alpha1 and alpha2 from own-label PGD on test "
                                   "images the descendant classifies correctly, the gain over its scratch twins, "
                                   "and Spearman's rho over the pairs. Writes knowledge.csv, "
                                   "knowledge_correlations.csv and knowledge_transfer.png.")
    p.add_argument("models", nargs="*", metavar="DESCENDANT", help="fine-tuned models (default: every trained one)")
    p.add_argument("--size", help="zoo size (default: $ADVTRANSFER_SIZE or cpu)")
    p.add_argument("--n", type=int, default=500, help="test images 0..n-1 (default 500)")
    p.add_argument("--eps", default="8/255", help="PGD radius, L-inf (default 8/255)")
    p.add_argument("--steps", type=int, default=20, help="PGD steps (default 20)")
    p.add_argument("--out", metavar="DIR", required=True, help="folder for the tables and the figure")
    p.add_argument("--data-dir", help="CIFAR-10 npz folder (default: $ADVTRANSFER_DATA)")
    p.add_argument("--cache-dir", help="cache of trained models (default: $ADVTRANSFER_CACHE)")


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


def cmd_whitebox_match(args: argparse.Namespace) -> int:
    from .mismatch import write_tables
    from .whitebox_match import matched_whitebox

    attacks = [a.strip() for a in args.attack.split(",") if a.strip()]
    per, pooled = matched_whitebox(args.run_dir, args.ladder, attacks, args.baseline)
    if per.empty:
        raise UserError("no surrogate has both a white-box row in RUN and a ladder with it as victim in LADDER")
    paths = write_tables({"whitebox_match": per, "whitebox_match_pooled": pooled}, args.out or args.run_dir)
    cols = ["attack", "surrogate", "victim", "whitebox_attack", "asr_attack", "eps_matched", "asr_matched", "diff",
            "diff_ci_low", "diff_ci_high", "asr_same_eps"]
    print(f"transfer at equal white-box success; matched: {args.baseline} on its eps ladder (eps_matched in /255)")
    _print(per, cols)
    print("\nmean over the victims of each surrogate (points)")
    _print(pooled, ["attack", "surrogate", "n_victims", "whitebox_attack", "whitebox_ladder_max", "eps_matched", "diff",
                    "diff_ci_low", "diff_ci_high", "n_victims_worse"])
    print(f"\ntables: {paths[0]} and {paths[1]}")
    return 0


def _print(df, cols) -> None:
    from .mismatch import format_pct

    if df.empty:
        print("(no rows)")
        return
    print(format_pct(df[[c for c in cols if c in df.columns]], _PCT).to_string(index=False))


def cmd_dumb(args: argparse.Namespace) -> int:
    from .mismatch import dumb_table, write_tables

    cases, costs = dumb_table(args.run_dir, args.attack)
    paths = write_tables({"dumb_cases": cases, "dumb_costs": costs}, args.out or args.run_dir)
    print("ASR (%) per case; interval: image bootstrap; range: per model pair")
    _print(cases, ["attack_label", "source", "arch", "balance", "n_pairs", "asr", "asr_ci_low", "asr_ci_high",
                   "pair_asr_min", "pair_asr_max"])
    print("\ncost of a mismatch (points): ASR(only that axis differs) - ASR(all match)")
    _print(costs, ["attack_label", "axis", "n_pairs_mismatch", "asr_match", "asr_mismatch", "diff", "diff_ci_low",
                   "diff_ci_high", "n_drop", "n_surrogates", "p_sign"])
    print(f"\ntables: {paths[0]} and {paths[1]}")
    return 0


def cmd_lineage(args: argparse.Namespace) -> int:
    from .mismatch import lineage_table, write_tables

    groups, contrasts = lineage_table(args.run_dir, args.attack)
    paths = write_tables({"lineage_groups": groups, "lineage_contrasts": contrasts}, args.out or args.run_dir)
    _print(groups, ["attack_label", "victim_recipe", "relation", "victim_data", "n_rows", "clean_acc", "asr",
                    "asr_ci_low", "asr_ci_high"])
    print("\nown descendant vs controls (points)")
    _print(contrasts, ["attack_label", "descendant", "vs", "control", "asr_descendant", "asr_control", "diff",
                       "diff_ci_low", "diff_ci_high"])
    print(f"\ntables: {paths[0]} and {paths[1]}")
    return 0


def cmd_knowledge(args: argparse.Namespace) -> int:
    from ..config import default_size
    from ..utils import parse_fraction
    from .knowledge import correlations, knowledge_table, scatter
    from .mismatch import write_tables

    if args.n < 1 or args.steps < 1:
        raise UserError(f"--n and --steps must be positive, got {args.n} and {args.steps}")
    eps = parse_fraction(args.eps, "--eps")
    if not 0 < eps <= 1:
        raise UserError(f"--eps {args.eps} is outside (0, 1]; give it like 8/255")
    size = args.size or default_size()
    df = knowledge_table(args.models, size, args.n, eps, args.steps, args.cache_dir, args.data_dir)
    corr = correlations(df)
    paths = write_tables({"knowledge": df, "knowledge_correlations": corr}, args.out)
    fig = scatter(df, Path(args.out))
    cols = ["source", "descendant", "labels", "finetune", "alpha1", "alpha2", "own_change_rate", "acc_descendant",
            "acc_scratch", "gain"]
    print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print("\nSpearman's rho with the fine-tuning gain: over all pairs, and within each downstream task")
    print(corr.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"\ntables: {paths[0]} and {paths[1]}; figure: {fig}")
    return 0
