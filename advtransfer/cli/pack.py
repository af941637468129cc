"""``advtransfer pack RUN DEST``: a run folder without its adversarial examples, to resume an
interrupted run on another machine or to keep a finished one small (:mod:`advtransfer.run.pack`)."""
from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pack", help="copy a run folder's finished cells without their adversarial examples (resume it elsewhere)",
        description="Copy every finished cell of run folder RUN (its rows, per-image table and the manifest) into "
                    "DEST without the adversarial examples, which are most of a run's size. `advtransfer grid` "
                    "with the same grid and DEST (or a copy of it) as --out crafts only the cells that were not "
                    "finished; a packed cell that must answer a new victim is crafted again. Packing into a pack of "
                    "the same run adds the new cells: a run too long for one machine goes on in sittings.")
    p.add_argument("run_dir", metavar="RUN", help="run folder (what `advtransfer grid --out` wrote)")
    p.add_argument("dest", metavar="DEST", help="the pack: a new or empty folder, or an earlier pack of the same run")


def run(args: argparse.Namespace) -> int:
    from ..run.pack import pack_run

    r = pack_run(args.run_dir, args.dest)
    state = "finished run" if r.finished else f"unfinished run: {r.left_out} cell(s) still to run"
    print(f"pack {args.dest}: {r.cells} cell(s) ({r.new} new) from {args.run_dir}, {state}; "
          f"{r.bytes / 1e6:.2f} MB without examples. Resume: advtransfer grid <the same grid and options> --out {args.dest}")
    return 0
