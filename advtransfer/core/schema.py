"""The results schema: one place for the column names, types and meanings of the harness's tables.

The runner writes the results table and the per-image table through :func:`conform`; the tests
import the column lists; the column tables of docs/results-table.md are generated from here
(``python -m advtransfer.core.schema`` prints them; a test checks the page is current).

Units: pixels in [0,1]; ε and distortions in that space (8/255 ≈ 0.0314); rates are fractions in
[0,1] (plots show percent).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str          # pandas dtype: string, int64, float64, bool
    group: str
    meaning: str
    default: Any = None  # the value in rows that do not set the column (kind-specific fields); None: required


_NAN = math.nan
#: learned attacks (universal, generative) report their fit (column craft_fooling_rate) on at most
#: this many of their crafting images, the first ones
CRAFT_FIT_IMAGES = 500

RESULTS: tuple[Column, ...] = (
    Column("run_id", "string", "identity", "run folder name"),
    Column("cell_id", "string", "identity", "hash of the cell's canonical config (attack version and surrogate weight checksums included)"),
    Column("dataset", "string", "identity", "dataset name (cifar10, an image folder, ...)"),
    Column("split", "string", "identity", "split the images come from (test)"),
    Column("n", "int64", "identity", "images attacked and evaluated in this row"),
    Column("seed", "int64", "identity", "attack seed (random starts and transforms are drawn per image from it)"),
    Column("attack", "string", "attack", "registry name of the attack"),
    Column("attack_label", "string", "attack", "the grid's label for the attack entry (several labels may run one attack)"),
    Column("attack_kind", "string", "attack", "gradient, ensemble, universal, generative or feature"),
    Column("attack_version", "int64", "attack", "version of the attack's code; bumped whenever its output changes"),
    Column("attack_params", "string", "attack", "JSON of the resolved attack parameters"),
    Column("norm", "string", "attack", "linf or l2"),
    Column("eps", "float64", "attack", "ε in pixel space (8/255 = 0.0314)"),
    Column("eps_str", "string", "attack", "ε as written, e.g. 8/255"),
    Column("steps", "int64", "attack", "attack iterations (δ updates for universal attacks)"),
    Column("targeted", "bool", "attack", "targeted attack (success = the victim predicts the target)"),
    Column("ensemble", "string", "attack", "how a surrogate set is combined: logit, loss or prob"),
    Column("match", "string", "comparison", "none for an ordinary row; step or evals for a matched baseline", "none"),
    Column("baseline_for", "string", "comparison", "attack_label of the row this matched baseline serves", ""),
    Column("surrogate", "string", "surrogate", "surrogate set name (model names joined with +, or the grid's name)"),
    Column("surrogate_base", "string", "surrogate", "surrogate name without replicate suffix: replicates of one entry share it"),
    Column("replicate", "int64", "surrogate", "which independently seeded replicate of the surrogate models the row used", 0),
    Column("surrogate_kind", "string", "surrogate", "single, ensemble, sam, lgv, swag, csgld, es, ..."),
    Column("surrogate_params", "string", "surrogate", "JSON of how the surrogate was trained and drawn"),
    Column("n_surrogates", "int64", "surrogate", "models in the surrogate set"),
    Column("surrogate_sha", "string", "surrogate", "sha256 of the surrogate weights (joined with + for a set)"),
    Column("zoo_size", "string", "surrogate", "zoo size the models were trained at: ci, cpu or full"),
    Column("victim", "string", "victim", "victim model name"),
    Column("victim_family", "string", "victim", "cnn, mobile, dense, vit, clip, timm, defended, ..."),
    Column("is_whitebox", "bool", "victim", "the victim is one of the surrogates"),
    Column("victim_sha", "string", "victim", "sha256 of the victim's weights"),
    Column("surrogate_data", "string", "data", "training data of the surrogate models (joined with + for a set): all, or the variant's source, balance, shift and label set", "all"),
    Column("victim_data", "string", "data", "training data of the victim, as surrogate_data (a defence: its base's)", "all"),
    Column("victim_labels", "string", "data", "label set the victim predicts: cifar10 (the dataset's), or a downstream set scored on its own labels", "cifar10"),
    Column("n_task", "int64", "data", "images of the victim's task (= n, except for a downstream victim whose label set leaves classes out); -1 in rows written before the column existed", -1),
    Column("n_clean_correct", "int64", "counts", "victim right on x"),
    Column("n_adv_correct", "int64", "counts", "victim right on x_adv"),
    Column("n_success", "int64", "counts", "victim right on x and fooled on x_adv (targeted: predicts the target)"),
    Column("n_both_correct", "int64", "counts", "surrogate set and victim both right on x"),
    Column("n_transfer_success", "int64", "counts", "successes among n_both_correct"),
    Column("clean_acc", "float64", "rates", "n_clean_correct / n_task"),
    Column("adv_acc", "float64", "rates", "n_adv_correct / n_task"),
    Column("asr", "float64", "rates", "n_success / n_clean_correct"),
    Column("fooling_rate", "float64", "rates", "(n_clean_correct - n_adv_correct) / n_clean_correct"),
    Column("transfer_rate", "float64", "rates", "n_transfer_success / n_both_correct"),
    Column("asr_ci_low", "float64", "rates", "Wilson 95% interval of asr, lower end"),
    Column("asr_ci_high", "float64", "rates", "Wilson 95% interval of asr, upper end"),
    Column("asr_by_target", "string", "rates", "targeted rows: JSON {target class: [successes, clean-correct images aimed at it, ASR]}; asr is their pooled mean", ""),
    Column("n_abstain", "int64", "defence", "victim right on x and abstaining on x_adv (randomized smoothing); neither correct nor a success", 0),
    Column("draws", "int64", "defence", "independent draws of a stochastic defence evaluated (1 otherwise); counts and asr are draw 0's", 1),
    Column("asr_draws_mean", "float64", "defence", "mean over the draws of each draw's ASR (its own clean and adversarial labels)", _NAN),
    Column("asr_draws_worst", "float64", "defence", "highest ASR over the draws: the defence's worst draw", _NAN),
    Column("linf_max", "float64", "distortion", "largest L∞ of x_adv - x over the images"),
    Column("linf_mean", "float64", "distortion", "mean L∞ of x_adv - x"),
    Column("l2_mean", "float64", "distortion", "mean L2 of x_adv - x"),
    Column("l2_median", "float64", "distortion", "median L2 of x_adv - x"),
    Column("universal", "bool", "kind", "one perturbation for every image (universal kind)", False),
    Column("n_craft", "float64", "kind", "training images a universal or generative attack learned on (empty otherwise)", _NAN),
    Column("craft_fooling_rate", "float64", "kind", f"universal and generative: the surrogate set's fooling rate (targeted: target hit rate) on up to {CRAFT_FIT_IMAGES} crafting images", _NAN),
    Column("gen_params", "int64", "kind", "generative: parameters of the trained generator (-1 otherwise)", -1),
    Column("aux_passes", "float64", "cost", "generative: forward+backward image-passes through auxiliary models during training (PDCL's CLIP image tower; empty otherwise)", _NAN),
    Column("gen_train_s", "float64", "kind", "generative: wall time (s) of the generator's training (part of craft_s)", _NAN),
    Column("gen_at_bound", "float64", "kind", "generative: share of the perturbations at the ε bound on the evaluated images (L∞: entries with |δ| ≥ 0.99ε; L2: images with ‖δ‖ ≥ 0.99ε); near 1 for a saturated generator", _NAN),
    Column("gen_universal", "float64", "kind", "generative: share of δ's energy in its image-independent part, N‖mean δ‖² / Σ‖δ_i‖² over the evaluated images: 1 when the generator gives every image the same δ (it has collapsed into a universal perturbation)", _NAN),
    Column("gen_updates", "int64", "kind", "generative with a curve (curve_every > 0): optimiser updates made, fewer than steps where stop: plateau ended the training (-1 otherwise)", -1),
    Column("gen_curve", "string", "kind", "generative with a curve: JSON [[updates, surrogate passes, held-out fooling rate], ...] measured on curve_n training images after the first n_craft, before the first update and every curve_every updates", ""),
    Column("gen_plateau_at", "float64", "kind", "generative with a curve: the updates after which the held-out fooling rate rose by less than plateau_gain for patience points in a row (the stop rule's point, also where stop: budget); empty if it never flattened", _NAN),
    Column("bandit_counts", "string", "kind", "X-Transfer: JSON of how often the bandit used each surrogate", ""),
    Column("grad_evals", "int64", "cost", "surrogate forward+backward passes per image (per crafting image for universal and generative attacks, which learn on training images)"),
    Column("surrogate_passes", "float64", "cost", "the cell's total surrogate forward+backward image-passes: grad_evals × images crafted (per-image kinds) or × n_craft (universal, generative); the compute to compare attacks at", _NAN),
    Column("craft_s", "float64", "cost", "crafting wall time (s) of the cell"),
    Column("eval_s", "float64", "cost", "evaluation wall time (s) of this victim"),
    Column("device", "string", "cost", "torch device of the run"),
    Column("precision", "string", "cost", "autocast of the crafting passes: fp32, bf16 or fp16 (victims are evaluated in fp32)", "fp32"),
    Column("compile", "string", "cost", "per surrogate model (joined with +): compiled or eager as timed at the run's start (compile: auto), off when not asked; empty for examples crafted before the column existed", ""),
    Column("batch_used", "int64", "cost", "crafting batch size after any halving on out-of-memory (-1: not recorded, e.g. universal kinds)", -1),
    Column("git_sha", "string", "provenance", "commit of the code that made the row"),
    Column("advtransfer_version", "string", "provenance", "package version"),
    Column("torch_version", "string", "provenance", "torch version"),
    Column("created_at", "string", "provenance", "UTC time the row was written"),
)

SAMPLES: tuple[Column, ...] = (
    Column("cell_id", "string", "identity", "the row's cell"),
    Column("victim", "string", "identity", "victim model name"),
    Column("index", "int64", "identity", "dataset index of the image"),
    Column("clean_correct", "bool", "outcome", "victim right on x"),
    Column("adv_pred", "int64", "outcome", "victim's label on x_adv"),
    Column("success", "bool", "outcome", "as counted in n_success"),
    Column("margin", "float64", "outcome", "victim's true-class logit minus the best other on x_adv (targeted: target logit minus best other)"),
    Column("linf", "float64", "distortion", "L∞ of x_adv - x"),
    Column("l2", "float64", "distortion", "L2 of x_adv - x"),
    Column("success_draws", "float64", "outcome", "share of a stochastic defence's draws in which the image is a success (= success for other victims)", _NAN),
    Column("min_scale", "float64", "minimal", "smallest t with the victim fooled by clip(x + t·δ) as the scan and bisection find it (a scale seen to fool), inf if none up to the cap", _NAN),
    Column("min_linf", "float64", "minimal", "L∞ of clip(x + t·δ) - x at min_scale", _NAN),
    Column("min_l2", "float64", "minimal", "L2 of clip(x + t·δ) - x at min_scale", _NAN),
    Column("min_exact", "float64", "minimal", "1: every query agrees with a ray that stays fooled once fooled, so min_scale is the minimum within the tolerance if it does (an island narrower than the scan step can still go unseen); 0: upper bound, the scan saw the victim fooled and then not fooled at a larger scale", _NAN),
    Column("queries", "float64", "minimal", "victim forward passes the minimal-distortion search used", _NAN),
    Column("min_search", "string", "minimal", "the search and its parameters that measured the row (scan points, cap, tolerances); empty until measured", ""),
)

COMPARISONS: tuple[Column, ...] = (
    Column("a_label", "string", "pair", "attack label of row A"),
    Column("b_label", "string", "pair", "attack label of row B (a matched baseline by default)"),
    Column("a_cell_id", "string", "pair", "cell of A (one of them when pooled over replicates)"),
    Column("b_cell_id", "string", "pair", "cell of B"),
    Column("surrogate", "string", "pair", "surrogate (base name when pooled over replicates)"),
    Column("victim", "string", "pair", "victim"),
    Column("eps", "float64", "pair", "ε"),
    Column("match", "string", "pair", "how B is matched to A: step, evals or none"),
    Column("n_pairs", "int64", "statistics", "images both rows count (clean-correct for the victim)"),
    Column("n_a_only", "int64", "statistics", "A succeeds, B fails (McNemar's b)"),
    Column("n_b_only", "int64", "statistics", "B succeeds, A fails (McNemar's c)"),
    Column("asr_a", "float64", "statistics", "A's success rate on the pairs"),
    Column("asr_b", "float64", "statistics", "B's success rate on the pairs"),
    Column("diff", "float64", "statistics", "asr_a - asr_b"),
    Column("diff_ci_low", "float64", "statistics", "95% interval of diff, lower end"),
    Column("diff_ci_high", "float64", "statistics", "95% interval of diff, upper end"),
    Column("p_mcnemar", "float64", "statistics", "exact two-sided McNemar p-value (stratified test over replicates)"),
    Column("p_holm", "float64", "statistics", "Holm-adjusted over the comparisons of one call"),
    Column("verdict", "string", "statistics", "a_better, b_better or no_difference at 0.05 (Holm)"),
    Column("method", "string", "statistics", "how the interval was computed"),
    Column("n_strata", "int64", "statistics", "surrogate replicates pooled (1 if none)"),
)

TABLES = {"results": RESULTS, "samples": SAMPLES, "comparisons": COMPARISONS}


def names(columns: Sequence[Column]) -> list[str]:
    """The column names, in table order."""
    return [c.name for c in columns]


def required(columns: Sequence[Column]) -> list[str]:
    """Names of the columns every row must set (no default)."""
    return [c.name for c in columns if c.default is None]


def conform(df: pd.DataFrame, columns: Sequence[Column]) -> pd.DataFrame:
    """``df`` with the schema's columns first in schema order (extra columns after, in their own
    order), defaults filled where a kind-specific column is missing, and schema dtypes applied.
    A missing required column is a programming error (``ValueError``)."""
    df = df.copy()
    missing = [c.name for c in columns if c.name not in df.columns and c.default is None]
    if missing:
        raise ValueError(f"table lacks required columns {missing}")
    for c in columns:
        if c.name not in df.columns:
            df[c.name] = c.default
        elif c.default is not None:
            df[c.name] = df[c.name].where(df[c.name].notna(), c.default) if c.dtype != "float64" else df[c.name]
        if c.dtype == "string":
            df[c.name] = df[c.name].astype(object).where(df[c.name].notna(), None)
        else:
            df[c.name] = df[c.name].astype(c.dtype)
    order = names(columns)
    return df[order + [c for c in df.columns if c not in order]]


def markdown_table(columns: Sequence[Column]) -> str:
    """The columns as a Markdown table grouped as in the schema (for docs/results-table.md)."""
    lines = ["| group | column | type | meaning |", "| --- | --- | --- | --- |"]
    last = None
    for c in columns:
        lines.append(f"| {c.group if c.group != last else ''} | `{c.name}` | {c.dtype} | {c.meaning} |")
        last = c.group
    return "\n".join(lines)


def readme_block(table: str) -> str:
    """The generated block that stands in docs/results-table.md between ``<!-- schema:TABLE -->`` markers."""
    return f"<!-- schema:{table} -->\n{markdown_table(TABLES[table])}\n<!-- /schema:{table} -->"


if __name__ == "__main__":  # python -m advtransfer.core.schema: the blocks of docs/results-table.md
    for t in TABLES:
        print(readme_block(t), end="\n\n")
