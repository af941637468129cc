"""``advtransfer measure RUN NAME[,NAME...]``: run registered measures (the harness's and those a
plugin registers with ``@register_measure``) on a finished run folder, writing
``RUN/measures/<name>.parquet``, ``.csv`` and ``.json``; ``--list`` lists them."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..core.errors import UserError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("measure", help="run registered measures (yours too: --plugin) on a run folder into RUN/measures/",
                       description="Run registered measures on a finished run folder: each writes one table, "
                                   "RUN/measures/<name>.parquet/.csv with a .json record, which the report shows. "
                                   "A plugin registers its own with advtransfer.analysis.measures.register_measure.")
    p.add_argument("run_dir", nargs="?", help="run folder written by `advtransfer grid`")
    p.add_argument("names", nargs="?", help="comma-separated measure names (see --list)")
    p.add_argument("--list", action="store_true", help="list the registered measures and exit")
    p.add_argument("--data-dir", help="CIFAR-10 npz folder (default: $ADVTRANSFER_DATA)")
    p.add_argument("--cache-dir", help="cache of trained models (default: $ADVTRANSFER_CACHE)")
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--plugin", action="append", metavar="FILE|MODULE",
                   help="load the user's code first (a .py file or module registering measures); repeatable")


def run(args: argparse.Namespace) -> int:
    from .. import plugins
    from ..analysis.measures.registry import MEASURES, measure_names, run_measure

    if args.list:
        for name in measure_names():
            m = MEASURES.get(name)
            owner = plugins.owner(MEASURES.kind, name)
            print(f"{name:20s} {m.description}" + (" [loads models]" if m.loads_models else "")
                  + (f" (plugin {owner.ref})" if owner else ""))
        return 0
    if not args.run_dir or not args.names:
        raise UserError("name a run folder and one or more measures: advtransfer measure RUN NAME[,NAME] "
                        "(advtransfer measure --list shows them)")
    run = Path(args.run_dir)
    if not run.is_dir():
        raise UserError(f"run folder {args.run_dir!r} does not exist; pass the folder `advtransfer grid` wrote")
    names = [n.strip() for n in args.names.split(",") if n.strip()]
    names = [MEASURES.canonical(n) for n in names]  # every name known before the first measure runs
    from ..analysis.runs import run_context

    run_context(run)  # a run folder (results and manifest) before anything is written
    device = "cpu"
    if any(MEASURES.get(n).loads_models for n in names):
        from ..core.config import default_device
        from ..run.validate import check_device

        device = check_device(args.device or default_device(), "--device" if args.device else "ADVTRANSFER_DEVICE")
    from ..core.lock import RunLock

    with RunLock(run):
        for name in names:
            table, path = run_measure(run, name, device=device, cache=args.cache_dir, data_dir=args.data_dir)
            print(f"{name}: {len(table)} rows -> {path}")
    return 0
