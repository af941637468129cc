"""``advtransfer knowledge``: adversarial-transferability metrics (alpha1, alpha2) of each source ->
fine-tuned descendant beside the fine-tuning gain (Liang et al.); crafts own-label PGD on zoo models."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..core.errors import UserError
from ..analysis.runs import check_out_dir, write_tables


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("knowledge", help="adversarial-transferability metrics (alpha1, alpha2) of each source -> "
                                         "fine-tuned descendant beside the fine-tuning gain, and their correlation",
                       description="Liang et al.'s metrics on trained zoo models: for each descendant (an entry "
                                   "with init_from) and its source, alpha1 and alpha2 from own-label PGD on test "
                                   "images the descendant classifies correctly, the gain over its scratch twins, "
                                   "and Spearman's rho over the pairs. Writes knowledge.csv, "
                                   "knowledge_correlations.csv and knowledge_transfer.png.")
    p.add_argument("models", nargs="*", metavar="DESCENDANT", help="fine-tuned models (default: every trained one)")
    p.add_argument("--size", help="zoo size (default: $ADVTRANSFER_SIZE or converged)")
    p.add_argument("--n", type=int, default=500, help="test images 0..n-1 (default 500)")
    p.add_argument("--eps", default="8/255", help="PGD radius, L-inf (default 8/255)")
    p.add_argument("--steps", type=int, default=20, help="PGD steps (default 20)")
    p.add_argument("--out", metavar="DIR", required=True, help="folder for the tables and the figure")
    p.add_argument("--data-dir", help="CIFAR-10 npz folder (default: $ADVTRANSFER_DATA)")
    p.add_argument("--cache-dir", help="cache of trained models (default: $ADVTRANSFER_CACHE)")


def run(args: argparse.Namespace) -> int:
    from ..core.config import zoo_size
    from ..core.utils import parse_fraction
    from ..analysis.measures.knowledge import correlations, knowledge_table, scatter

    # every argument is checked before a model is loaded or an image crafted
    size = zoo_size(args.size)
    check_out_dir(args.out)
    if args.n < 1 or args.steps < 1:
        raise UserError(f"--n and --steps must be positive, got {args.n} and {args.steps}")
    eps = parse_fraction(args.eps, "--eps")
    if not 0 < eps <= 1:
        raise UserError(f"--eps {args.eps} is outside (0, 1]; give it like 8/255")
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
