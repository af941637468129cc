"""``advtransfer grid``: run a grid (train missing models, craft each cell once, evaluate every
victim), then draw its heatmaps and write its report."""
from __future__ import annotations

import argparse

from .common import common_args, setup_env


def add_parser(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("grid", help="run a grid: train missing models, craft each cell once, evaluate all victims, "
                                    "write results.parquet/csv and the heatmaps",
                       description="Run a grid file. Finished cells are skipped; new victims are evaluated on "
                                   "cached adversarial examples without re-crafting.")
    g.add_argument("grid", nargs="?", default="cifar10", help="grid name under grids/ or a YAML path (default: cifar10)")
    g.add_argument("--attack", help="run only this attack (comma-separated; any registry attack)")
    g.add_argument("--out", help="run folder (default: results/<grid name>/)")
    g.add_argument("--size", help="override the grid's zoo size (ci, cpu, converged, full)")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                   help="change a key of the grid file before it is read, the value as YAML; a dotted path sets "
                        "one key inside a mapping (--set eps=[16/255] --set defaults.steps=50 --set "
                        "'attacks.ti3={attack: tifgsm, kernel_size: 3}'); repeatable. The run is named "
                        "<grid name>@set-<hash> (its default folder) unless name= is set")
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
    g.add_argument("--deadline", metavar="WHEN",
                   help="start no cell that, at the speed this run measures, would end after WHEN: a duration "
                        "from now (90m, 2h30m, 45s) or a clock time (ISO 8601: 2026-12-08T00:40, local time "
                        "unless it names a zone). The cell running then finishes, missing models are trained "
                        "first regardless; a run that stops early keeps its finished cells and exits with 75 "
                        "(rerun with a later deadline, or none, to go on). Serial executor only")
    g.add_argument("--dry-run", action="store_true",
                   help="check everything, then list the cells (cached or not), the models to train and each "
                        "cell's cost in passes; train and write nothing")
    common_args(g)


def run(args: argparse.Namespace) -> int:
    from ..grid import load_grid
    from ..analysis.plots import plot_run
    from ..run.context import RunContext
    from ..run.runner import run_dir_for, run_grid

    device = setup_env(args)
    spec = load_grid(args.grid, args.attack, args.sets)
    spec = spec.with_overrides(
        size=args.size, n=args.n, precision=args.precision, compile=args.compile, executor=args.executor,
        workers=args.workers, plugins=_with_cli_plugins(spec.plugins, args))
    deadline = None
    if args.deadline is not None:
        from ..run.deadline import parse_deadline

        deadline = parse_deadline(args.deadline)  # seconds since the epoch; one line when unreadable
    # the run's folder, cache, data, device, profile and deadline, made once here and passed down as one value
    ctx = RunContext(run_dir_for(spec, args.out), args.cache_dir, args.data_dir, device,
                     progress=not args.no_progress, profile=args.profile, deadline=deadline)
    if args.dry_run:
        return _print_plan(spec, ctx)
    run_dir = run_grid(spec, ctx)  # runs the preflight before any training or writing
    print(f"results: {run_dir / 'results.parquet'} and {run_dir / 'results.csv'}")
    print(f"adversarial examples: {run_dir / 'adv'}/")
    if not args.no_plot:
        figs = plot_run(run_dir)
        print(f"figures: {len(figs)} files in {run_dir / 'figures'}/")
    _print_summary(run_dir)
    if not args.no_report:
        from .report import report_run

        paths = report_run(run_dir)
        print(f"report: {paths['html']} (and report.md, LaTeX tables in {paths['md'].parent / 'tables'}/)")
    return 0


def _with_cli_plugins(plugins, args: argparse.Namespace) -> tuple[str, ...] | None:
    """The grid's plugins and those of --plugin (loaded by main before the grid was read), as the
    run's workers load them; None when --plugin names none."""
    if not getattr(args, "plugin", None):
        return None
    from ..plugins import resolve_ref

    return tuple(dict.fromkeys([*plugins, *(resolve_ref(r) for r in args.plugin)]))


def _print_plan(spec, ctx) -> int:
    from ..run.runner import plan_grid

    plan = plan_grid(spec, ctx)
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
    from ..run.store import RunStore

    df = RunStore(run_dir).read_results()
    for (label, eps), sub in df.groupby(["attack_label", "eps_str"], sort=False):
        m = (sub.pivot_table(index="surrogate", columns="victim", values="asr", aggfunc="mean") * 100).round(1)
        print(f"\nASR % · {label} · eps {eps}")
        print(m.to_string())
