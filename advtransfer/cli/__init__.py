"""Command-line interface: ``advtransfer grid|zoo|plot|attacks|...``, one module per command.

Each command module has ``add_parser(sub)``, which declares its arguments, and ``run(args) -> exit
code``, which checks every argument before it loads a model, crafts or writes. :func:`build_parser`
assembles the parser from :data:`COMMANDS`' modules in the order ``advtransfer --help`` lists them;
:func:`main` (the ``advtransfer`` script, ``python -m advtransfer``) dispatches to their ``run``.
The run commands (grid, zoo, plot, attacks, pas, layers) come first, then the analysis commands,
which run a measure (writing its tables) or the report on a run folder.

Bad input (unknown names, malformed files, missing data) prints one line starting with
``advtransfer: error:`` and exits with code 2. A grid run that stops before its ``--deadline``
exits with 75 (:data:`DEADLINE_EXIT`), one interrupted by Ctrl-C or SIGTERM with 130 or 143.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from . import (attacks, claims, compare, distortion, dumb, golden, grid, knowledge, layers, lineage, measure, pack,
               pas, plot, report, whitebox_match, zoo)
from ..core.config import ENVIRONMENT
from ..core.errors import UserError
from ..run.deadline import DeadlineReached
from ..run.executors import CellsFailed

# command name -> module, in the order `advtransfer --help` lists them
_MODULES = {"grid": grid, "pack": pack, "zoo": zoo, "plot": plot, "attacks": attacks, "pas": pas, "layers": layers,
            "compare": compare, "report": report, "distortion": distortion, "golden": golden, "dumb": dumb,
            "lineage": lineage, "knowledge": knowledge, "whitebox-match": whitebox_match,
            "claims": claims, "measure": measure}
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {name: m.run for name, m in _MODULES.items()}


EPILOG = """\
examples:
  advtransfer grid cifar10 --attack mifgsm      run the default CIFAR-10 grid for MI-FGSM
  advtransfer grid grids/ci.yaml --out /tmp/run  a grid file, results in /tmp/run
  advtransfer pack /tmp/run /tmp/packed          the run without its examples: resume it elsewhere
  advtransfer zoo train --size ci                train every zoo model at CI size
  advtransfer zoo list                           models, whether trained, clean accuracy
  advtransfer plot results/cifar10               transfer-matrix heatmaps of a run
  advtransfer attacks                            the attack registry
  advtransfer compare results/cifar10            attacks vs matched baselines (McNemar, Holm)
  advtransfer report results/cifar10             report.md/html and LaTeX tables of a run
  advtransfer golden results/ci --check          paired check against results/baselines/ci
  advtransfer distortion results/cifar10         minimal distortion, HopSkipJump, union, FiT, SAT

environment:
""" + "\n".join(f"  {name:24s} {what}" for name, what in ENVIRONMENT.items()) + "\n"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="advtransfer", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Adversarial-transferability benchmark harness: craft attacks on surrogate models "
                    "and measure their success on a grid of victims.")
    from .. import __version__

    ap.add_argument("--version", action="version", version=f"advtransfer {__version__}")
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND")
    for m in _MODULES.values():
        m.add_parser(sub)
    return ap


#: exit status of a run that stopped before its --deadline (sysexits' EX_TEMPFAIL: try again later)
DEADLINE_EXIT = 75


def _on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt("SIGTERM")


def main(argv: Sequence[str] | None = None) -> int:
    import signal

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cmd is None:
        parser.print_help()
        return 2
    # SIGTERM (a scheduler's stop, `kill`) ends the run like Ctrl-C: the current cell is abandoned
    # (its files are only ever complete or absent), finished cells are merged into the table
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (an embedding application): leave signals alone
        previous = None
    try:
        if hasattr(args, "plugin"):  # the user's code first: the command may name what it registers
            from ..plugins import load_plugins

            load_plugins(args.plugin or ())
        return COMMANDS[args.cmd](args)
    except UserError as exc:
        print(f"advtransfer: error: {exc}", file=sys.stderr)
        return 2
    except CellsFailed as exc:  # not bad input: the other cells finished; the listed ones did not
        print(f"advtransfer: error: {len(exc.failures)} of {exc.total} cells failed twice (first try and "
              f"retry); the other cells are in the table; the tracebacks are in {exc.run_dir / 'run.log'}",
              file=sys.stderr)
        for cid, err in exc.failures.items():
            print(f"  cell {cid}: {err}", file=sys.stderr)
        return 1
    except DeadlineReached as exc:  # not a failure: the run stopped at a cell boundary, as asked
        print(f"advtransfer: {exc}; the finished cells are saved: rerun with a later --deadline (or none) "
              "to go on", file=sys.stderr)
        return DEADLINE_EXIT
    except KeyboardInterrupt as exc:
        what = "SIGTERM" if str(exc) == "SIGTERM" else "interrupted"
        import shlex

        again = shlex.join(["advtransfer", *(argv if argv is not None else sys.argv[1:])])
        print(f"advtransfer: {what}: the current cell was abandoned, finished cells are saved; "
              f"resume with: {again}", file=sys.stderr)
        return 130 if what == "interrupted" else 143
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)

