"""``advtransfer compare RUN [RUN_B]``: paired comparisons of attacks (or surrogates, victims, runs)
written as comparisons.parquet/.csv and forest plots."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..core.errors import UserError
from ..analysis.runs import check_out_dir


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="paired comparisons (exact McNemar, 95%% CI, Holm) of attacks vs their matched baselines, "
                        "or of two runs; writes comparisons.parquet/csv and forest plots",
        description="Compare rows on the same images and victim. One run: every attack against its matched "
                    "baselines (or --a against --b). Two runs: each row of RUN against the same row of RUN_B "
                    "(diff = RUN - RUN_B).")
    p.add_argument("run_dir", metavar="RUN")
    p.add_argument("run_b", nargs="?", metavar="RUN_B", help="a second run folder: regression diff RUN - RUN_B")
    p.add_argument("--a", dest="a_label", metavar="LABEL", help="attack label of row A (with --b)")
    p.add_argument("--b", dest="b_label", metavar="LABEL", help="attack label of row B (with --a)")
    p.add_argument("--reference", metavar="SURROGATE",
                   help="compare surrogates instead of attacks: every other surrogate against this one, same attack")
    p.add_argument("--reference-victim", metavar="VICTIM",
                   help="compare victims instead of attacks: every other victim against this one on the same "
                        "adversarial examples (is a defence fooled less?)")
    p.add_argument("--method", default="newcombe", choices=["newcombe", "bootstrap"],
                   help="95%% interval of the difference: Newcombe's paired score interval (default) or a seeded "
                        "paired bootstrap (10,000 resamples)")
    p.add_argument("--out", metavar="DIR", help="folder for the tables and figures/ (default: RUN)")
    p.add_argument("--no-plot", action="store_true", help="do not draw the forest plots")


def run(args: argparse.Namespace) -> int:
    from ..analysis.measures.compare import (compare_run, compare_runs, compare_surrogates, compare_victims,
                                             forest_plot, format_table, verdict_plot, write_comparisons)
    from ..analysis.runs import read_results

    check_out_dir(args.out)
    out = Path(args.out) if args.out else Path(args.run_dir)
    if args.reference and args.reference_victim:
        raise UserError("--reference compares surrogates and --reference-victim victims: give one of them")
    if args.run_b:
        if args.a_label or args.b_label or args.reference_victim:
            raise UserError("--a/--b pick rows within one run; with two runs every shared row is compared")
        df = compare_runs(args.run_dir, args.run_b, args.method)
        stem = f"comparisons_vs_{Path(args.run_b).resolve().name}"
    elif args.reference:
        if args.a_label or args.b_label:
            raise UserError("--reference compares surrogates; --a/--b compare attacks: give one or the other")
        df = compare_surrogates(args.run_dir, args.reference, args.method)
        stem = "comparisons"
    elif args.reference_victim:
        if args.a_label or args.b_label:
            raise UserError("--reference-victim compares victims; --a/--b compare attacks: give one or the other")
        df = compare_victims(args.run_dir, args.reference_victim, args.method)
        stem = f"comparisons_victims_vs_{args.reference_victim}"
    else:
        df = compare_run(args.run_dir, args.a_label, args.b_label, args.method)
        stem = "comparisons"
    paths = write_comparisons(df, out, stem)
    print(format_table(df))
    print(f"\ncomparisons: {paths[0]} and {paths[1]}")
    if not args.no_plot:
        figs = forest_plot(df, out, stem)
        if stem == "comparisons" and not args.reference and not args.run_b:
            figs += verdict_plot(df, read_results(args.run_dir), out, stem)
        print(f"forest and verdict plots: {len(figs)} files in {out / 'figures'}/")
    return 0
