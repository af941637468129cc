"""The analysis commands, one per module (as lm-eval's ``_cli/``): each has ``add_parser(sub)``,
which declares its arguments, and ``run(args) -> exit code``, which checks every argument before
it loads a model, crafts or writes, then runs a measure (writing its tables) or the report.
:mod:`advtransfer.cli` registers them with :func:`add_parsers` and dispatches through :data:`COMMANDS`."""
from __future__ import annotations

import argparse
from typing import Callable

from . import claims, compare, distortion, dumb, golden, knowledge, lineage, measure, report, whitebox_match

# command name -> module, in the order `advtransfer --help` lists them
_MODULES = {"compare": compare, "report": report, "distortion": distortion, "golden": golden, "dumb": dumb,
            "lineage": lineage, "knowledge": knowledge, "whitebox-match": whitebox_match,
            "claims": claims, "measure": measure}
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {name: m.run for name, m in _MODULES.items()}


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add every analysis command's subparser to ``sub`` (the ``advtransfer`` subcommands)."""
    for m in _MODULES.values():
        m.add_parser(sub)
