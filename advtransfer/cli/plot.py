"""``advtransfer plot``: a run folder's transfer-matrix heatmaps."""
from __future__ import annotations

import argparse

from ..core.errors import UserError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="draw transfer-matrix heatmaps of a run folder into RUN_DIR/figures/")
    p.add_argument("run_dir")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..analysis.plots import plot_run

    if not Path(args.run_dir).is_dir():
        raise UserError(f"run folder {args.run_dir!r} does not exist")
    figs = plot_run(args.run_dir)
    print(f"{len(figs)} figures written to {Path(args.run_dir) / 'figures'}/")
    return 0
