"""``advtransfer layers``: a zoo model's layer names and output shapes."""
from __future__ import annotations

import argparse

from .common import plugin_flag


def add_parser(sub: argparse._SubParsersAction) -> None:
    la = sub.add_parser("layers", help="list a zoo model's layers (names for the feature-level and "
                                       "backward-path attacks' layer parameter) with output shapes")
    la.add_argument("model", help="zoo model name (see advtransfer zoo list)")
    plugin_flag(la)
    la.add_argument("--all", action="store_true", help="every named module, not only the block chain")
    la.add_argument("--size", help="zoo size whose network to list (sizes may build different networks; "
                                   "default: $ADVTRANSFER_SIZE or converged)")


def run(args: argparse.Namespace) -> int:
    from ..attacks.features import list_layers, resolve_layer
    from ..models import zoo

    from ..core.config import zoo_size

    size = zoo_size(args.size)
    src = zoo.declared(zoo.get_spec(args.model))
    model = src.network(size)  # shapes and names do not depend on the weights: nothing is trained
    model.eval()
    infos = list_layers(model)
    auto = resolve_layer(model, "auto", model_name=args.model) if any(li.candidate for li in infos) else None
    pen = resolve_layer(model, "penultimate", model_name=args.model)
    shown = [li for li in infos if args.all or li.candidate or li.name == pen]
    width = max(len(li.name) for li in shown)
    print(f"{args.model} ({src.arch_name(size)}): {'every module' if args.all else 'block chain'}; "
          f"layer names as the attacks' layer parameter takes them")
    for li in shown:
        mark = "  <- auto" if li.name == auto else ("  <- penultimate (its input)" if li.name == pen else "")
        tag = "block" if li.candidate else ""
        print(f"  {li.name:{width}s}  {li.type:20s} {tag:5s} {'x'.join(map(str, li.shape)):>12s}{mark}")
    if not args.all:
        print(f"  ({len(infos)} modules in all: --all lists every one)")
    return 0
