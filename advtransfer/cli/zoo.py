"""``advtransfer zoo train|list|ship|export``: the model zoo."""
from __future__ import annotations

import argparse

from ..core.errors import UserError
from .common import common_args, plugin_flag, setup_env


def add_parser(sub: argparse._SubParsersAction) -> None:
    z = sub.add_parser("zoo", help="train or list the model zoo (surrogates/*.yaml, victims/*.yaml)")
    zs = z.add_subparsers(dest="zoo_cmd", metavar="ZOO_COMMAND")
    zt = zs.add_parser("train", help="train the named models (default: all) that are missing or stale")
    zt.add_argument("names", nargs="*", help="model names (default: every zoo entry with a recipe at the size)")
    zt.add_argument("--size", help="ci, cpu, converged (default: $ADVTRANSFER_SIZE or converged, the shipped zoo) or full")
    zt.add_argument("--retrain", action="store_true",
                    help="train into the cache even when shipped or cached (and say whether the weights "
                         "reproduce the shipped checksum)")
    common_args(zt)
    zl = zs.add_parser("list", help="list zoo entries with architecture, family and training state")
    zl.add_argument("--size", help="ci, cpu, converged (default: $ADVTRANSFER_SIZE or converged, the shipped zoo) or full")
    zl.add_argument("--cache-dir")
    plugin_flag(zl)
    zl.add_argument("--shipped", action="store_true",
                    help="a Markdown table of the models shipped at the size (the zoo table of docs/zoo.md)")
    zp = zs.add_parser("ship", help="copy trained models from the cache into the project's zoo/<size>/ "
                                    "(for maintainers: the weights a fresh clone uses)")
    zp.add_argument("names", nargs="+", help="trained model names")
    zp.add_argument("--size", help="zoo size (default: $ADVTRANSFER_SIZE or converged)")
    zp.add_argument("--cache-dir")
    ze = zs.add_parser("export", help="write trained models as Hugging Face Hub repositories: OUT/<name>/README.md "
                                      "(a model card), model.safetensors and advtransfer.json")
    ze.add_argument("names", nargs="+", help="trained model names")
    ze.add_argument("--out", required=True, help="folder to write one sub-folder per model into")
    ze.add_argument("--size", help="zoo size (default: $ADVTRANSFER_SIZE or converged)")
    ze.add_argument("--cache-dir")


def run(args: argparse.Namespace) -> int:
    from ..core.config import zoo_size
    from ..models import zoo

    if args.zoo_cmd == "train":
        device = setup_env(args)
        size = zoo_size(args.size)
        # by default every entry the harness trains that has a recipe at this size; pretrained
        # (open_clip, timm) entries load when named
        specs = zoo.load_specs()
        names = args.names or [n for n, s in specs.items() if zoo.declared(s).trains_at(size, specs)]
        for n in names:  # every name checked before anything trains
            zoo.get_spec(n).identity(size)
        if args.retrain:
            return _retrain(names, size, args, device)
        cards = zoo.ensure_trained(names, size, args.cache_dir, args.data_dir, device, not args.no_progress)
        for c in cards:
            acc = "acc   n/a" if c.get("clean_acc") is None else f"acc {c['clean_acc']:.3f}"
            print(f"{c['name']:16s} {c['arch']:10s} {c['family']:9s} {acc}  {c['train_s']:.0f} s")
        return 0
    if args.zoo_cmd == "ship":
        from ..models.ship import ship

        size = zoo_size(args.size)
        for n in args.names:
            card = ship(n, size, args.cache_dir)
            print(f"{n:16s} shipped to zoo/{size}/: acc {card['clean_acc']:.4f}, sha256 {card['sha256'][:16]}")
        return 0
    if args.zoo_cmd == "export":
        from ..analysis.runs import check_out_dir
        from ..models.hfcard import export_hf

        size = zoo_size(args.size)
        check_out_dir(args.out)
        for n in args.names:  # every name known and trained before anything is written
            zoo.get_spec(n)
            if zoo.read_card(n, size, args.cache_dir) is None:
                raise UserError(f"model {n!r} is not trained at size {size!r}; run `advtransfer zoo train {n} --size {size}`")
        for folder in export_hf(args.names, size, args.out, args.cache_dir):
            print(f"{folder.name:16s} -> {folder}/ (README.md, model.safetensors, advtransfer.json)")
        return 0
    if args.zoo_cmd == "list":
        size = zoo_size(args.size)
        if args.shipped:
            from ..models.ship import shipped_table

            print(shipped_table(size))
            return 0
        for name, spec in zoo.load_specs().items():
            state = zoo.declared(spec).cache_state(size, args.cache_dir)
            print(f"{name:16s} {spec.arch:10s} {spec.family:9s} {spec.kind:8s} {size}: {state}")
        return 0
    raise UserError("zoo needs a subcommand: train, list, ship or export (see advtransfer zoo --help)")


def _retrain(names: list[str], size: str, args: argparse.Namespace, device: str) -> int:
    """``zoo train --retrain``: train each model afresh into the cache and compare its weights'
    sha256 with the shipped card's (bit-identical on a machine of the same kind and thread count)."""
    import json

    from ..models import zoo
    from ..models.store import shipped_paths

    for n in names:
        card = zoo.train_spec(zoo.get_spec(n), size, args.cache_dir, args.data_dir, device, not args.no_progress)
        shipped = shipped_paths(n, size)
        verdict = "nothing shipped to compare"
        if shipped is not None:
            ref = json.loads(shipped[1].read_text())
            same = ref.get("sha256") == card["sha256"]
            verdict = ("reproduces the shipped sha256" if same else
                       f"differs from the shipped sha256 {ref.get('sha256', '?')[:16]} (shipped: {ref.get('provenance')}; "
                       f"clean acc {ref.get('clean_acc')})")
        print(f"{n:16s} acc {card['clean_acc']:.4f}  {card['train_s']:.0f} s  sha256 {card['sha256'][:16]}: {verdict}")
    return 0
