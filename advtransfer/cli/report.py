"""``advtransfer report RUN``: report.md, report.html and LaTeX tables of a run; the comparisons
it shows are written first by the compare measure (the report itself only reads)."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..analysis.runs import check_out_dir


def report_run(run_dir: str | Path, out: str | Path | None = None) -> dict:
    """What ``advtransfer report`` (and ``advtransfer grid`` after a run) does: write the run's
    comparisons when absent or older than its results (:func:`refresh_comparisons`), then the
    report from the run folder (:func:`build_report`). Returns build_report's paths."""
    from ..core.errors import UserError
    from ..analysis.measures.compare import refresh_comparisons
    from ..analysis.report import build_report

    if not Path(run_dir).is_dir():
        raise UserError(f"run folder {str(run_dir)!r} does not exist; pass the folder `advtransfer grid` wrote")
    note = refresh_comparisons(run_dir)
    return build_report(run_dir, out, comparisons_note=note)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write RUN/report/report.md, report.html and LaTeX tables of a run",
                       description="Report of a run folder: configuration, clean accuracies, ASR tables with "
                                   "Wilson intervals, transfer matrices, comparisons as sentences, compute.")
    p.add_argument("run_dir", metavar="RUN")
    p.add_argument("--out", metavar="DIR", help="report folder (default: RUN/report)")


def run(args: argparse.Namespace) -> int:
    check_out_dir(args.out)
    paths = report_run(args.run_dir, args.out)
    print(f"report: {paths['md']} and {paths['html']}; {len(paths['tex'])} LaTeX tables in {paths['md'].parent / 'tables'}/")
    return 0
