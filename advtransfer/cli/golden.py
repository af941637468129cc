"""``advtransfer golden RUN --update|--check`` (registered in :mod:`advtransfer.cli`)."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..core.errors import UserError


def default_baseline(run_dir: str | Path) -> Path:
    """``results/baselines/<grid name>`` of the checkout (``./results`` from an installed copy), the
    grid name from the run's manifest."""
    from ..core.resources import results_dir
    from ..grid import RunSpec
    from ..run.store import RunStore

    name = RunSpec.from_manifest(RunStore(run_dir).read_manifest()).name or "ci"
    return results_dir() / "baselines" / name


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..analysis.measures.golden import REFRESH_COMMAND, Tolerance

    t = Tolerance()
    p = sub.add_parser(
        "golden", help="write a run's per-image counts as the golden baseline (--update), or check a run "
                       "against it (--check; exit 1 naming the rows that moved)",
        description="Golden regression baseline of a run (results/baselines/<grid>/counts.csv and meta.json). "
                    "--check: a row whose models have the baseline's weights must match bit for bit (on a machine whose "
                    "kernels round as the baseline's: its kernel probe); otherwise it is "
                    "paired with the baseline on the same images and moved when the exact McNemar test on the "
                    f"discordant images gives p < {t.alpha:g}, the ASR changed by more than {t.max_points:g} "
                    "percentage points, or its (attack, eps, seed) group shifted one way (exact stratified test, "
                    f"p < {t.alpha_group:g}). The ci baseline is refreshed with `{REFRESH_COMMAND}`.")
    p.add_argument("run_dir", metavar="RUN")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--update", action="store_true", help="write RUN's counts as the baseline")
    mode.add_argument("--check", action="store_true", help="compare RUN with the baseline")
    p.add_argument("--baseline", metavar="DIR", help="baseline folder (default: results/baselines/<grid name>)")
    p.add_argument("--alpha", type=float, default=t.alpha, help=f"McNemar level per row (default {t.alpha:g})")
    p.add_argument("--alpha-group", type=float, default=t.alpha_group,
                   help=f"level of the group-shift test (default {t.alpha_group:g})")
    p.add_argument("--max-points", type=float, default=t.max_points,
                   help=f"largest allowed ASR change in percentage points (default {t.max_points:g})")


def run(args: argparse.Namespace) -> int:
    from ..analysis.measures.golden import (Tolerance, compare_tables, counts_table, failure_message, read_baseline,
                                   same_kernels, write_baseline)

    if not Path(args.run_dir).is_dir():
        raise UserError(f"run folder {args.run_dir!r} does not exist; pass the folder `advtransfer grid` wrote")
    baseline = Path(args.baseline) if args.baseline else default_baseline(args.run_dir)
    if args.update:
        out = write_baseline(args.run_dir, baseline)
        print(f"baseline written: {out}/counts.csv and meta.json ({len(counts_table(args.run_dir))} rows)")
        return 0
    tol = Tolerance(args.alpha, args.max_points, args.alpha_group)
    base, meta = read_baseline(baseline)
    now = counts_table(args.run_dir)
    exact = same_kernels(meta, baseline)
    moved, within = compare_tables(now, base, tol, exact=exact)
    if moved:
        print(failure_message(moved, args.run_dir, baseline, tol, meta, len(now), exact=exact))
        return 1
    same = len(now) - within
    kernels = "" if exact else ("; this machine's float32 kernels round differently from the baseline's (kernel "
                                "probe), so rows on its weights were held to the statistical rule")
    print(f"golden check passed: {len(now)} rows of {args.run_dir} against {baseline}: {same} identical, "
          f"{within} within tolerance ({tol.describe()}){kernels}")
    return 0
