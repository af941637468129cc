"""``advtransfer distortion RUN``: minimal distortion along every transfer direction, ASR-vs-ε
figures, the HopSkipJump yardstick, worst case over attacks, FiT source selection and SAT
similarity of a finished run folder (crafts no transfer attack; HopSkipJump is a query attack on
each victim, the yardstick)."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..core.errors import UserError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("distortion", help="distortion at the centre: minimal distortion per transfer direction, "
                                          "ASR vs eps, HopSkipJump yardstick, union over attacks, FiT, SAT",
                       description="Measure a run folder: minimal scale of each transferred perturbation that "
                                   "fools each victim (merged into samples/), distortion.parquet/csv, "
                                   "figures/asr_eps_*, blackbox.parquet, exposure.*, fit.*, similarity.* and "
                                   "figures/sat_*.")
    p.add_argument("run_dir", help="run folder written by `advtransfer grid`")
    p.add_argument("--victims", help="comma-separated victims (default: every victim of the run)")
    p.add_argument("--cap", type=float, default=4.0, help="largest scale of the direction tried (default 4)")
    p.add_argument("--scan-per-unit", type=int, default=4,
                   help="scan points per unit of scale before the bisection (default 4: a step of 1/4, 16 points "
                        "up to cap 4); a finer scan sees narrower fooled islands, so fewer minima are upper bounds "
                        "unseen, at one victim pass per extra point")
    p.add_argument("--blackbox-budgets", default="100,1000",
                   help="HopSkipJump query budgets per image, comma-separated (default 100,1000; 0 skips it)")
    p.add_argument("--blackbox-n", type=int, default=20,
                   help="images attacked by HopSkipJump, the run's first N (default 20: with the default budgets "
                        "and variant, at most 20,000 victim queries per victim, one to three minutes per CIFAR victim "
                        "on 2 CPU cores)")
    p.add_argument("--blackbox-norms", default="l2",
                   help="HopSkipJump variants, l2 and/or linf (default l2: the L-inf distance of the points it "
                        "finds is recorded too, an upper bound on the minimal L-inf; add linf for the L-inf "
                        "variant, which doubles the time)")
    p.add_argument("--fit-budgets", default="10,50,200", help="FiT target-query budgets Q (default 10,50,200)")
    p.add_argument("--no-plot", action="store_true", help="write the tables only, no figures")
    p.add_argument("--data-dir", help="CIFAR-10 npz folder (default: $ADVTRANSFER_DATA)")
    p.add_argument("--cache-dir", help="cache of trained models (default: $ADVTRANSFER_CACHE)")
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")


def upper_bound_line(summ) -> str:
    """One sentence: how many of the measured minima (clean-correct images, every cell × victim) are
    exact within the tolerance and how many are upper bounds (the ray turned back to not fooled)."""
    n_ub = int(summ["n_upper_bound"].sum()) if len(summ) else 0
    n_fooled = int(summ["n_fooled_within_cap"].sum()) if len(summ) else 0
    share = n_ub / n_fooled if n_fooled else 0.0
    return (f"minima measured: {n_fooled} fooled within the cap, {n_fooled - n_ub} exact within the tolerance, "
            f"{n_ub} upper bounds ({100 * share:.2f}%: the victim was fooled, then not, further along the ray)")


def _ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise UserError(f"{what} must be comma-separated integers, got {text!r}") from None
    if any(v < 0 for v in vals):
        raise UserError(f"{what} must be >= 0, got {text!r}")
    return [v for v in vals if v > 0]


def run(args: argparse.Namespace) -> int:
    from ..core.config import default_device

    run = Path(args.run_dir)
    if not run.is_dir():
        raise UserError(f"run folder {args.run_dir!r} does not exist")
    if not args.cap > 0:
        raise UserError(f"--cap must be positive, got {args.cap}")
    if args.scan_per_unit < 1:
        raise UserError(f"--scan-per-unit must be an integer >= 1, got {args.scan_per_unit}")
    if args.blackbox_n < 1:
        raise UserError(f"--blackbox-n must be positive, got {args.blackbox_n}")
    bb = _ints(args.blackbox_budgets, "--blackbox-budgets")
    fq = _ints(args.fit_budgets, "--fit-budgets")
    norms = [t.strip() for t in args.blackbox_norms.split(",") if t.strip()]
    if any(nm not in ("l2", "linf") for nm in norms):
        raise UserError(f"--blackbox-norms takes l2 and/or linf, got {args.blackbox_norms!r}")
    if args.data_dir:
        from ..data import resolve_data_dir

        resolve_data_dir(args.data_dir)
    device = args.device or default_device()
    victims = [v.strip() for v in args.victims.split(",")] if args.victims else None
    from ..core.lock import RunLock
    from ..run.validate import check_device

    device = check_device(device, "--device" if args.device else "ADVTRANSFER_DEVICE")
    from ..analysis.runs import run_context

    run_context(run)  # a run folder (results and manifest) before anything is locked or written
    with RunLock(run):  # it adds columns to the per-image tables: one writer at a time
        return _measure(args, run, bb, fq, norms, device, victims)


def _measure(args: argparse.Namespace, run: Path, bb: list[int], fq: list[int], norms: list[str], device: str,
             victims: list[str] | None) -> int:
    import pandas as pd

    from ..analysis.measures.blackbox import measure_blackbox
    from ..analysis.measures.distortion import measure_run
    from ..analysis.measures.exposure import exposure_table, plot_asr_vs_eps
    from ..analysis.measures.fit import fit_select
    from ..analysis.measures.similarity import plot_similarity, sat_tables
    from ..analysis.stats import summarize_blackbox
    from ..analysis.runs import run_context

    res, _ = run_context(run)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 30)

    summ = measure_run(run, victims, cap=args.cap, device=device, cache=args.cache_dir, data_dir=args.data_dir,
                       log=print, scan_per_unit=args.scan_per_unit)
    print(f"\nminimal distortion along the transfer direction (cap {args.cap:g}, scan step 1/{args.scan_per_unit}; "
          "L∞ ×255; clean-correct images)")
    show = summ.assign(**{c: summ[c] * 255 for c in ("q25_min_linf", "median_min_linf", "q75_min_linf")})
    print(show[["surrogate", "attack_label", "eps_str", "victim", "median_min_linf", "q25_min_linf", "q75_min_linf",
                "median_min_l2", "auc", "n_fooled_within_cap", "n_upper_bound", "n_clean_correct"]
               ].round(3).to_string(index=False))
    print(upper_bound_line(summ))
    if not args.no_plot:
        figs = plot_asr_vs_eps(run)
        print(f"\nASR-vs-ε figures: {len(figs)} files in {run / 'figures'}/")

    if bb:
        table = measure_blackbox(run, victims, bb, args.blackbox_n, norms, device=device, cache=args.cache_dir,
                                 data_dir=args.data_dir, log=print)
        bs = summarize_blackbox(table, sorted(set(res["eps"])))
        print(f"\nHopSkipJump yardstick ({args.blackbox_n} images; minimal distortion found within the budget; "
              "L∞ ×255)")
        bs = bs.assign(median_min_linf=bs["median_min_linf"] * 255)
        asr_cols = [c for c in bs.columns if c.startswith("asr_linf_")]
        print(bs[["victim", "norm", "budget", "n_clean_correct", "median_min_l2", "median_min_linf",
                  "mean_queries", *asr_cols]].round(3).to_string(index=False))
        print("(asr_linf_E: share of clean-correct images HopSkipJump fooled within L∞ E, the run's ε in [0,1] units)")

    exp, _ = exposure_table(run)
    print("\nworst case over transfer attacks (union over every surrogate × attack at each ε; white-box cells left out)")
    print(exp.assign(median_min_linf=exp["median_min_linf"] * 255)[
        ["victim", "eps_str", "n_cells", "asr_union", "asr_best_member", "robust_acc_union", "median_min_linf",
         "best_member"]].round(3).to_string(index=False))

    if fq:
        try:
            fit = fit_select(run, fq, device=device, cache=args.cache_dir, data_dir=args.data_dir)
        except UserError as exc:
            print(f"\nFiT skipped: {exc}")
        else:
            if len(fit):
                print("\nFiT source selection vs best-in-hindsight and random pick (ASR on clean-correct images)")
                print(fit[["victim", "eps_str", "Q", "fit_source", "fit_asr", "best_source", "best_asr",
                           "random_asr", "regret_asr"]].round(3).to_string(index=False))
            else:
                print("\nFiT: no victim has two or more transfer cells at one ε")

    pairs = sat_tables(run)
    sfig = [] if args.no_plot else plot_similarity(run, pairs)
    if len(pairs):
        print("\nSAT similarity (log of the two-way transfer rate in %; pairs of models that are both surrogate and victim)")
        print(pairs.round(3).to_string(index=False))
    print(f"SAT figures: {len(sfig)} files in {run / 'figures'}/")
    print(f"\ntables: {run}/distortion.*, blackbox.parquet, exposure.*, fit.*, similarity.*")
    return 0
