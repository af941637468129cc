"""Command-line interface: ``advtransfer grid|zoo|plot|attacks``.

Bad input (unknown names, malformed files, missing data) prints one line starting with
``advtransfer: error:`` and exits with code 2.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from .analysis.cli import COMMANDS as ANALYSIS_COMMANDS, add_parsers as add_analysis_parsers
from .config import ENVIRONMENT
from .errors import UserError
from .executors import CellsFailed

EPILOG = """\
examples:
  advtransfer grid cifar10 --attack mifgsm      run the default CIFAR-10 grid for MI-FGSM
  advtransfer grid grids/ci.yaml --out /tmp/run  a grid file, results in /tmp/run
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


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", help="folder with CIFAR-10 train.npz/test.npz (default: $ADVTRANSFER_DATA, else torchvision download)")
    p.add_argument("--cache-dir", help="cache for trained models (default: $ADVTRANSFER_CACHE or ~/.cache/advtransfer)")
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _plugin_flag(p)


def _plugin_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plugin", action="append", metavar="FILE|MODULE",
                   help="load the user's attacks, networks (a .py file or module) or model catalogue (.yaml) "
                        "first; repeatable (see docs/guides/add-an-attack.md)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="advtransfer", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Adversarial-transferability benchmark harness: craft attacks on surrogate models "
                    "and measure their success on a grid of victims.")
    from . import __version__

    ap.add_argument("--version", action="version", version=f"advtransfer {__version__}")
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND")

    g = sub.add_parser("grid", help="run a grid: train missing models, craft each cell once, evaluate all victims, "
                                    "write results.parquet/csv and the heatmaps",
                       description="Run a grid file. Finished cells are skipped; new victims are evaluated on "
                                   "cached adversarial examples without re-crafting.")
    g.add_argument("grid", nargs="?", default="cifar10", help="grid name under grids/ or a YAML path (default: cifar10)")
    g.add_argument("--attack", help="run only this attack (comma-separated; any registry attack)")
    g.add_argument("--out", help="run folder (default: results/<grid name>/)")
    g.add_argument("--size", help="override the grid's zoo size (ci, cpu, converged, full)")
    g.add_argument("-n", type=int, help="override the number of images")
    g.add_argument("--no-plot", action="store_true", help="do not draw the heatmaps")
    g.add_argument("--no-report", action="store_true", help="do not write RUN/report (comparisons, tables, report.html)")
    g.add_argument("--executor", help="who runs the cells: serial (default; one after another here), local "
                                      "(worker processes on this machine: one per GPU, or splitting the CPU cores) "
                                      "or submitit (Slurm job arrays); default: the grid's executor key, else serial")
    g.add_argument("--workers", type=int, help="local executor: worker processes (default: one per GPU, else one "
                                               "per core); submitit with cluster local: array tasks")
    g.add_argument("--profile", help="submitit executor: YAML file of cluster parameters (cluster, slurm_partition, "
                                     "gpus_per_node, cpus_per_task, mem_gb, timeout_min, cells_per_task, ...)")
    g.add_argument("--precision", help="autocast of the crafting passes: fp32 (default), bf16, or fp16 (CUDA); "
                                       "victims are always evaluated in fp32; default: the grid's precision key")
    g.add_argument("--compile", help="off (default) or auto: compile each single surrogate where a short timing at "
                                     "the start of the run finds it faster (recorded in the row); default: the grid's key")
    g.add_argument("--dry-run", action="store_true",
                   help="check everything, then list the cells (cached or not), the models to train and each "
                        "cell's cost in passes; train and write nothing")
    _common(g)

    z = sub.add_parser("zoo", help="train or list the model zoo (surrogates/*.yaml, victims/*.yaml)")
    zs = z.add_subparsers(dest="zoo_cmd", metavar="ZOO_COMMAND")
    zt = zs.add_parser("train", help="train the named models (default: all) that are missing or stale")
    zt.add_argument("names", nargs="*", help="model names (default: every zoo entry with a recipe at the size)")
    zt.add_argument("--size", help="ci, cpu, converged (default: $ADVTRANSFER_SIZE or converged, the shipped zoo) or full")
    zt.add_argument("--retrain", action="store_true",
                    help="train into the cache even when shipped or cached (and say whether the weights "
                         "reproduce the shipped checksum)")
    _common(zt)
    zl = zs.add_parser("list", help="list zoo entries with architecture, family and training state")
    zl.add_argument("--size", help="ci, cpu, converged (default: $ADVTRANSFER_SIZE or converged, the shipped zoo) or full")
    zl.add_argument("--cache-dir")
    _plugin_flag(zl)
    zl.add_argument("--shipped", action="store_true",
                    help="a Markdown table of the models shipped at the size (the zoo table of docs/zoo.md)")
    zp = zs.add_parser("ship", help="copy trained models from the cache into the project's zoo/<size>/ "
                                    "(for maintainers: the weights a fresh clone uses)")
    zp.add_argument("names", nargs="+", help="trained model names")
    zp.add_argument("--size", help="zoo size (default: $ADVTRANSFER_SIZE or converged)")
    zp.add_argument("--cache-dir")

    p = sub.add_parser("plot", help="draw transfer-matrix heatmaps of a run folder into RUN_DIR/figures/")
    p.add_argument("run_dir")

    _plugin_flag(sub.add_parser("attacks", help="list the registered attacks (torchattack:<Name> and "
                                               "torchattacks:<Name> included) and their parameters"))
    ps = sub.add_parser("pas", help="search a backpropagation path for a surrogate (PAS-style): one-step "
                                     "attacks on held-out training images scored on validation models you own")
    ps.add_argument("model", help="the surrogate (a trained single zoo model)")
    ps.add_argument("--validators", required=True,
                    help="comma-separated zoo models that score the paths (the attacker's own models, never the victims)")
    ps.add_argument("--n", type=int, default=500, help="held-out training images to score on (default 500)")
    ps.add_argument("--budget", type=int, default=40, help="candidate paths scored (default 40)")
    ps.add_argument("--search", default="bo", choices=("bo", "random"),
                    help="bo: Bayesian optimisation (Gaussian process, expected improvement; as the PAS paper; "
                         "needs optuna: the search extra) or random: distinct paths drawn uniformly (default bo)")
    ps.add_argument("--eps", default="8/255", help="one-step size (default 8/255)")
    ps.add_argument("--seed", type=int, default=0)
    ps.add_argument("--size", help="zoo size (default: $ADVTRANSFER_SIZE or converged)")
    ps.add_argument("--out", help="also write the scored paths as JSON here")
    _common(ps)
    la = sub.add_parser("layers", help="list a zoo model's layers (names for the feature-level and "
                                       "backward-path attacks' layer parameter) with output shapes")
    la.add_argument("model", help="zoo model name (see advtransfer zoo list)")
    _plugin_flag(la)
    la.add_argument("--all", action="store_true", help="every named module, not only the block chain")
    la.add_argument("--size", help="zoo size whose network to list (sizes may build different networks; "
                                   "default: $ADVTRANSFER_SIZE or converged)")
    add_analysis_parsers(sub)  # compare, report, distortion, golden, dumb, lineage, knowledge, whitebox-match
    return ap


def _setup_env(args: argparse.Namespace) -> str:
    """The device to run on (checked: it exists and is available); checks --data-dir."""
    from .config import default_device
    from .validate import check_device

    os.environ.setdefault("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "0"))
    if getattr(args, "data_dir", None):
        from .data import resolve_data_dir

        resolve_data_dir(args.data_dir)
    if getattr(args, "device", None):
        return check_device(args.device)
    return check_device(default_device(), "ADVTRANSFER_DEVICE")


def cmd_grid(args: argparse.Namespace) -> int:
    from .grid import load_grid
    from .plots import plot_run
    from .runner import run_grid

    device = _setup_env(args)
    spec = load_grid(args.grid, args.attack)
    spec = spec.with_overrides(
        size=args.size, n=args.n, precision=args.precision, compile=args.compile, executor=args.executor,
        workers=args.workers, plugins=_with_cli_plugins(spec.plugins, args))
    if args.dry_run:
        return _print_plan(spec, args, device)
    run_dir = run_grid(spec, args.out, args.cache_dir, args.data_dir, device, not args.no_progress,
                       profile=args.profile)  # runs the preflight before any training or writing
    print(f"results: {run_dir / 'results.parquet'} and {run_dir / 'results.csv'}")
    print(f"adversarial examples: {run_dir / 'adv'}/")
    if not args.no_plot:
        figs = plot_run(run_dir)
        print(f"figures: {len(figs)} files in {run_dir / 'figures'}/")
    _print_summary(run_dir)
    if not args.no_report:
        from .analysis.cli.report import report_run

        paths = report_run(run_dir)
        print(f"report: {paths['html']} (and report.md, LaTeX tables in {paths['md'].parent / 'tables'}/)")
    return 0


def _with_cli_plugins(plugins, args: argparse.Namespace) -> tuple[str, ...] | None:
    """The grid's plugins and those of --plugin (loaded by main before the grid was read), as the
    run's workers load them; None when --plugin names none."""
    if not getattr(args, "plugin", None):
        return None
    from .plugins import resolve_ref

    return tuple(dict.fromkeys([*plugins, *(resolve_ref(r) for r in args.plugin)]))


def _print_plan(spec, args: argparse.Namespace, device: str) -> int:
    from .runner import plan_grid

    plan = plan_grid(spec, args.out, args.cache_dir, args.data_dir, device, args.profile)
    cells = plan["cells"]
    print(f"dry run: grid {spec.name} ({spec.source}) into {plan['run_dir']}/; nothing was trained or written")
    print(f"models to train (size {spec.size}): {', '.join(plan['train']) if plan['train'] else 'none (all cached)'}")
    print(f"{'cell':16s}  {'surrogate':24s} {'attack':28s} {'eps':7s} {'seed':>4s}  {'examples':9s} "
          f"{'victims':>7s} {'craft passes':>13s} {'eval passes':>12s}")
    for c in cells:
        print(f"{c['cell_id'] or '(after training)':16s}  {c['surrogate'][:24]:24s} {c['attack'][:28]:28s} {c['eps']:7s} "
              f"{c['seed']:>4d}  {c['examples']:9s} {c['victims_to_evaluate']:>7d} {c['craft_passes']:>13,d} "
              f"{c['eval_passes']:>12,d}")
    todo = [c for c in cells if c["victims_to_evaluate"]]
    print(f"{len(cells)} cells, {len(todo)} with work to do: {sum(c['craft_passes'] for c in cells):,} surrogate "
          f"forward+backward passes to craft, {sum(c['eval_passes'] for c in cells):,} victim forward passes")
    return 0


def _print_summary(run_dir) -> None:
    from .store import RunStore

    df = RunStore(run_dir).read_results()
    for (label, eps), sub in df.groupby(["attack_label", "eps_str"], sort=False):
        m = (sub.pivot_table(index="surrogate", columns="victim", values="asr", aggfunc="mean") * 100).round(1)
        print(f"\nASR % · {label} · eps {eps}")
        print(m.to_string())


def cmd_zoo(args: argparse.Namespace) -> int:
    from .config import zoo_size
    from .models import zoo

    if args.zoo_cmd == "train":
        device = _setup_env(args)
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
        from .models.ship import ship

        size = zoo_size(args.size)
        for n in args.names:
            card = ship(n, size, args.cache_dir)
            print(f"{n:16s} shipped to zoo/{size}/: acc {card['clean_acc']:.4f}, sha256 {card['sha256'][:16]}")
        return 0
    if args.zoo_cmd == "list":
        size = zoo_size(args.size)
        if args.shipped:
            from .models.ship import shipped_table

            print(shipped_table(size))
            return 0
        for name, spec in zoo.load_specs().items():
            state = zoo.declared(spec).cache_state(size, args.cache_dir)
            print(f"{name:16s} {spec.arch:10s} {spec.family:9s} {spec.kind:8s} {size}: {state}")
        return 0
    raise UserError("zoo needs a subcommand: train or list (see advtransfer zoo --help)")


def _retrain(names: list[str], size: str, args: argparse.Namespace, device: str) -> int:
    """``zoo train --retrain``: train each model afresh into the cache and compare its weights'
    sha256 with the shipped card's (bit-identical on a machine of the same kind and thread count)."""
    import json

    from .models import zoo
    from .models.store import shipped_paths

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


def cmd_plot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .plots import plot_run

    if not Path(args.run_dir).is_dir():
        raise UserError(f"run folder {args.run_dir!r} does not exist")
    figs = plot_run(args.run_dir)
    print(f"{len(figs)} figures written to {Path(args.run_dir) / 'figures'}/")
    return 0


def cmd_attacks(args: argparse.Namespace) -> int:
    import inspect

    from .attacks import ATTACKS
    from .attacks.ecosystem import LIBRARIES, LibraryAttack, adapted_names, library_version, note
    from .plugins import owner

    for name in ATTACKS.names():
        cls = ATTACKS.get(name)
        if issubclass(cls, LibraryAttack):
            continue  # listed with their library below
        doc = inspect.getdoc(cls) or ""
        extra = getattr(cls, "extra_defaults", {})
        params = ", ".join(f"{k}={v}" for k, v in extra.items())
        first = ((inspect.getdoc(sys.modules[cls.__module__]) or doc).splitlines() or [""])[0]
        plugin = owner("attack", name)
        print(f"{name:14s} [{cls.kind}, v{cls.version}] {first}" + (f" (plugin {plugin.ref})" if plugin else ""))
        if params:
            print(f"{'':14s} parameters: {params}")
    for lib in LIBRARIES:  # adapted on first use (advtransfer.attacks.ecosystem)
        try:
            names = adapted_names(lib)
        except UserError as exc:
            print(f"\n{lib}: not installed ({exc})")
            continue
        print(f"\n{lib} {library_version(lib)}: grid attacks {lib}:<Name>, the library's parameters passed through")
        for n, why in names:
            if why is None:
                cls = ATTACKS.get(f"{lib}:{n}")
                params = ", ".join(f"{k}={v}" for k, v in cls.extra_defaults.items())
                extra = f" ({note(lib, n)})" if note(lib, n) else ""
                print(f"  {lib + ':' + n:24s} [gradient, v{cls.version}] steps={cls.default_steps}, {params}{extra}")
        refused: dict[str, list[str]] = {}
        for n, why in names:
            if why is not None:
                refused.setdefault(why, []).append(n)
        for why, ns in refused.items():
            print(f"  not runnable here: {', '.join(ns)}: {why}")
    return 0


#: test images the grids and claims evaluate on (0..999); a path search never scores on them
EVAL_IMAGES = 1000


def pas_images(n_train: int, used: int, n: int) -> tuple[str, int]:
    """Where a path search scores its ``n`` images: (split, first index). Training images after the
    ``used`` ones the surrogate's recipe trained on; if fewer than ``n`` are left (a converged
    model trains on all of them), test images after the first :data:`EVAL_IMAGES`, which no
    grid's default ``n`` reaches."""
    if n_train - used >= n:
        return "train", used
    return "test", EVAL_IMAGES


def cmd_pas(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from .attacks.pas import search_path
    from .config import zoo_size
    from .data import load_dataset
    from .models import zoo
    from .utils import parse_fraction

    # every argument is checked before a model trains or a file is written
    device = _setup_env(args)
    size = zoo_size(args.size)
    validators = [v.strip() for v in args.validators.split(",") if v.strip()]
    if not validators or args.model in validators:
        raise UserError("--validators needs one or more zoo models other than the surrogate")
    for name in (args.model, *validators):  # an unknown name, or an entry without this size: one line now
        zoo.get_spec(name).identity(size)
    if args.n < 1:
        raise UserError(f"--n must be >= 1 (held-out training images to score on), got {args.n}")
    data = load_dataset(zoo.get_spec(args.model).dataset, "train", args.data_dir)
    if args.n > len(data):
        raise UserError(f"--n {args.n} exceeds the {len(data)} training images")
    if args.budget < 1:
        raise UserError(f"--budget must be >= 1 (candidate paths to score), got {args.budget}")
    eps = parse_fraction(args.eps, "eps")
    if not 0 < eps <= 1:
        raise UserError(f"--eps {args.eps} is outside (0, 1]; give it like 8/255")
    if args.search == "bo":
        try:
            import optuna  # noqa: F401
        except ImportError:
            raise UserError("the bo path search needs optuna: pip install 'advtransfer[search]' "
                            "(or pass --search random)") from None
    if args.out:
        out = Path(args.out)
        if out.is_dir():
            raise UserError(f"--out {args.out!r} is a folder; give the path of the JSON file to write")
        if not out.parent.is_dir():
            raise UserError(f"--out {args.out!r}: folder {str(out.parent)!r} does not exist; create it first")
    zoo.ensure_trained([args.model, *validators], size, args.cache_dir, args.data_dir, device, not args.no_progress)
    card = zoo.read_card(args.model, size, args.cache_dir) or {}
    model = zoo.load_model(args.model, size, args.cache_dir, device, member=0)
    vals = [zoo.load_model(v, size, args.cache_dir, device, member=0) for v in validators]
    used = int((card.get("recipe") or {}).get("train_subset") or len(data))
    split, start = pas_images(len(data), used, args.n)
    if split == "test":
        data = load_dataset(zoo.get_spec(args.model).dataset, "test", args.data_dir)
        if start + args.n > len(data):
            raise UserError(f"--n {args.n}: the surrogate trained on every training image and the test set has only "
                            f"{len(data) - start} images after the {start} that grids evaluate on; pass a smaller --n")
    x, y = data.tensors(list(range(start, start + args.n)))[:2]
    where = ("not in its recipe's subset" if split == "train" else
             f"the surrogate trained on every training image; these follow the {start} test images grids evaluate on")
    print(f"path search for {args.model} on {split} images {start}..{start + args.n - 1} "
          f"({where}), scored on {', '.join(validators)}; {args.budget} candidates by {args.search} search")
    res = search_path(model, vals, x.to(device), y.to(device), eps, args.budget, args.seed, log=print,
                      method=args.search)
    best = res["best"]
    refs = res["references"]
    print("references: " + ", ".join(f"{k} {v['score']:.3f}" for k, v in refs.items()))
    print(f"best ({best['label']}, one-step ASR {best['score']:.3f}); as grid parameters:")
    print(f"  pas: {{gammas: {best['gammas']}, deltas: {best['deltas']}}}")
    if args.out:
        from .utils import atomic_write_text  # complete or absent, never half-written

        atomic_write_text(Path(args.out), json.dumps({"model": args.model, "validators": validators,
                                                      "images": [start, start + args.n], "eps": eps,
                                                      "seed": args.seed, **res}, indent=1))
    return 0


def cmd_layers(args: argparse.Namespace) -> int:
    from .attacks.features import list_layers, resolve_layer
    from .models import zoo

    from .config import zoo_size

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
            from .plugins import load_plugins

            load_plugins(args.plugin or ())
        return {"grid": cmd_grid, "zoo": cmd_zoo, "plot": cmd_plot, "attacks": cmd_attacks,
                "layers": cmd_layers, "pas": cmd_pas, **ANALYSIS_COMMANDS}[args.cmd](args)
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


if __name__ == "__main__":
    sys.exit(main())
