"""One grid cell as pure functions: craft adversarial examples once, evaluate any victims on them.

Nothing here touches files; the runner (:mod:`advtransfer.run.runner`) caches and stores around it,
so the same functions serve the serial runner, tests and the Python API unchanged.

Images are float tensors N×C×H×W with pixels in [0,1]; labels int64 N; ``index`` the dataset
indices (int64 N) that key every per-image record.
"""
from __future__ import annotations

import time
from typing import Callable, Mapping

import pandas as pd
import torch
import torch.nn as nn

from ..attacks.base import Attack, CraftContext, Crafted, SurrogateSet, make_targets
from ..core.metrics import (decide, distortion, goal_mask, labels, margins, per_sample_norms, predict_batched,
                            success_counts, success_mask)

__all__ = ["craft", "asr_by_target", "evaluate_victim", "evaluate_cell", "run_cell", "surrogate_correct", "make_targets"]


def craft(attack: Attack, surrogates: SurrogateSet, ctx: CraftContext) -> Crafted:
    """The cell's adversarial examples: the attack's craft protocol, whatever its kind."""
    return attack.craft(surrogates, ctx)


def surrogate_correct(surrogates: SurrogateSet, x: torch.Tensor, y: torch.Tensor, batch_size: int = 500,
                      device: str = "cpu") -> torch.Tensor:
    """Where the surrogate set's mean logits are right on clean ``x`` (bool N)."""
    return labels(surrogates.mean_logits, x, batch_size, device) == y


def evaluate_victim(victim: nn.Module, x: torch.Tensor, y: torch.Tensor, crafted: Crafted, clean_pred: torch.Tensor,
                    sur_correct: torch.Tensor, batch_size: int = 500, device: str = "cpu"
                    ) -> tuple[dict, pd.DataFrame]:
    """One victim on a crafted cell.

    ``x``, ``y``, ``clean_pred`` (the victim's labels on x) and ``sur_correct`` are those of the
    crafted images (``crafted.index``, same order); ``y`` holds the dataset's labels. A
    downstream victim (one with a ``label_map``, see :mod:`advtransfer.data.variants`) is scored on its
    own labels: an image is a success when its prediction changes from correct, images outside
    its task are not counted, and its rates are over the ``n_task`` images of its task.
    Returns the row's counts, rates, distortion and
    ``eval_s``, and the per-image table (``cell_id`` left to the caller): index, clean_correct,
    adv_pred, success, hit (the goal met on x_adv whether or not x was classified correctly: success
    over all images), margin, linf, l2, success_draws.

    A stochastic defence (:mod:`advtransfer.models.defences`) is evaluated in each of its
    ``draws``: the counts and per-image outcomes are draw 0's (``clean_pred`` must be draw 0's
    labels); ``asr_draws_mean`` and ``asr_draws_worst`` are the mean and the highest ASR over the
    draws, each draw with its own clean and adversarial labels, and ``success_draws`` the share
    of draws in which each image is a success.
    """
    from ..models.defences import draws_of

    t0 = time.perf_counter()
    n_task = len(y)
    label_map = getattr(victim, "label_map", None)
    if label_map is not None:  # a downstream victim with its own label set (advtransfer.data.variants)
        if crafted.target is not None:
            from ..core.errors import UserError

            raise UserError("a targeted attack's target is a class of the dataset; a downstream victim "
                            "with its own label set cannot be scored on it: leave it out of targeted grids")
        y = label_map.to(y.device)[y]  # images outside its task get OUT_OF_TASK: never clean-correct
        n_task = int((y >= 0).sum())
    k = draws_of(victim)
    if k > 1:
        victim.draw = 0
    logits = predict_batched(victim, crafted.x_adv, batch_size, device).float()
    adv_pred = decide(victim, logits)
    row = success_counts(y, clean_pred, adv_pred, sur_correct, crafted.target)
    success = success_mask(y, clean_pred, adv_pred, crafted.target)
    per_draw, asrs = [success], [row["asr"]]
    try:
        for d in range(1, k):
            victim.draw = d
            c = labels(victim, x, batch_size, device)
            s = success_mask(y, c, labels(victim, crafted.x_adv, batch_size, device), crafted.target)
            per_draw.append(s)
            n_ok = int((c == y).sum())
            asrs.append(int(s.sum()) / n_ok if n_ok else float("nan"))
    finally:
        if k > 1:
            victim.draw = 0
    eval_s = time.perf_counter() - t0
    if n_task != len(y):  # rates over the images of the victim's task
        row.update(clean_acc=row["n_clean_correct"] / n_task if n_task else float("nan"),
                   adv_acc=row["n_adv_correct"] / n_task if n_task else float("nan"))
    if crafted.target is not None:
        row["asr_by_target"] = asr_by_target(crafted.target, clean_pred == y, success)
    row.update(distortion(x, crafted.x_adv), eval_s=eval_s, draws=k, n_task=n_task,
               asr_draws_mean=float(torch.tensor(asrs, dtype=torch.float64).mean()),
               asr_draws_worst=float(max(asrs)))
    linf, l2 = per_sample_norms(x, crafted.x_adv)
    goal = crafted.target if crafted.target is not None else y
    margin = margins(logits, goal.clamp(min=0)).double()
    margin[goal < 0] = float("nan")  # outside a downstream victim's task
    samples = pd.DataFrame({
        "index": crafted.index.numpy(), "clean_correct": (clean_pred == y).numpy(), "adv_pred": adv_pred.numpy(),
        "success": success.numpy(), "hit": goal_mask(y, adv_pred, crafted.target).numpy(), "margin": margin.numpy(), "linf": linf.numpy(),
        "l2": l2.numpy(), "success_draws": torch.stack(per_draw).double().mean(0).numpy()})
    return row, samples


def asr_by_target(target: torch.Tensor, clean_correct: torch.Tensor, success: torch.Tensor) -> str:
    """JSON {target class: [successes, clean-correct images aimed at it, ASR]} of a targeted row
    (classes as strings, in order): the per-target success behind the row's mean ``asr``."""
    import json

    out = {}
    for c in sorted(set(target.tolist())):
        m = (target == c) & clean_correct
        n, k = int(m.sum()), int((success & m).sum())
        out[str(c)] = [k, n, (k / n) if n else None]
    return json.dumps(out)


def evaluate_cell(crafted: Crafted, surrogates: SurrogateSet, victims: Mapping[str, nn.Module], x: torch.Tensor,
                  y: torch.Tensor, index: torch.Tensor, clean_preds: Mapping[str, torch.Tensor] | None = None,
                  batch_size: int = 500, device: str = "cpu", progress: Callable[[str], None] | None = None
                  ) -> tuple[list[dict], pd.DataFrame]:
    """Evaluate every victim on the same crafted examples.

    ``x, y, index``: the images the cell was crafted from (the context's); the crafted ones are the
    subset ``crafted.index``. ``clean_preds``: each victim's labels on all of ``x`` if already known.
    Returns one row dict per victim (with ``victim``, ``grad_evals``, ``craft_s``) and the per-image
    table of all victims (with ``victim``). ``progress(name)`` is called after each victim.
    """
    keep = torch.isin(index, crafted.index)
    xc, yc = x[keep], y[keep]
    if not torch.equal(index[keep], crafted.index):
        raise ValueError("crafted.index must be a subset of index in the same order")
    sur_ok = surrogate_correct(surrogates, xc, yc, batch_size, device)
    rows, samples = [], []
    for name, model in victims.items():
        clean = clean_preds[name] if clean_preds is not None and name in clean_preds else labels(model, x, batch_size, device)
        row, ps = evaluate_victim(model, xc, yc, crafted, clean[keep], sur_ok, batch_size, device)
        rows.append({"victim": name, **row, "grad_evals": crafted.grad_evals, "craft_s": crafted.craft_s})
        samples.append(ps.assign(victim=name))
        if progress is not None:
            progress(name)
    return rows, pd.concat(samples, ignore_index=True) if samples else pd.DataFrame()


def run_cell(attack: Attack, surrogates: SurrogateSet, victims: Mapping[str, nn.Module], ctx: CraftContext
             ) -> tuple[Crafted, list[dict], pd.DataFrame]:
    """Craft once on the surrogate set, then evaluate every victim on the same x_adv (a pure
    function of its inputs: no files, no global state). Returns (crafted, rows, per-image table)."""
    crafted = craft(attack, surrogates, ctx)
    rows, samples = evaluate_cell(crafted, surrogates, victims, ctx.x, ctx.y, ctx.index,
                                  batch_size=2 * ctx.batch_size, device=ctx.device)
    return crafted, rows, samples
