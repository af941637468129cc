"""Pure functions on tensors: success counts, rates, distortions, Wilson intervals."""
from __future__ import annotations

import math
from typing import Callable

import torch


@torch.no_grad()
def predict_batched(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, batch_size: int = 500,
                    device: str = "cpu") -> torch.Tensor:
    """``fn`` (a model giving logits, or a function giving labels) over ``x`` (N×C×H×W pixels in
    [0,1], any device) in batches on ``device``; returns its outputs concatenated on the CPU.
    Logits (2-D outputs) are returned as they are; use :func:`labels` for top-1 classes.

    The passes run under inference mode (no autograd records); a batch that runs out of
    accelerator memory is retried with half the size (:class:`advtransfer.core.accel.BatchPlan`)."""
    from .accel import BatchPlan

    def chunk(s: int, e: int) -> torch.Tensor:
        with torch.inference_mode():
            return fn(x[s:e].to(device)).cpu()

    outs = BatchPlan(batch_size).run(chunk, len(x))
    return torch.cat(outs) if outs else torch.empty(0)  # outside inference mode: an ordinary tensor


#: the label of an abstaining victim (randomized smoothing): never right, never a success
ABSTAIN = -1


def decide(model: Callable[[torch.Tensor], torch.Tensor], scores: torch.Tensor) -> torch.Tensor:
    """A model's labels from its outputs: the model's own ``decide`` where it has one (a
    defence that may abstain, giving :data:`ABSTAIN`), else the top-1 class."""
    fn = getattr(model, "decide", None)
    return fn(scores) if fn is not None else scores.argmax(1)


def labels(model: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, batch_size: int = 500,
           device: str = "cpu") -> torch.Tensor:
    """Top-1 labels (N, int64) of ``model`` on pixels ``x`` in [0,1], batched (:data:`ABSTAIN`
    where an abstaining defence abstains)."""
    return predict_batched(lambda xb: decide(model, model(xb)), x, batch_size, device)


def margins(logits: torch.Tensor, cls: torch.Tensor) -> torch.Tensor:
    """Logit of class ``cls`` minus the largest other logit, per sample (N,). Positive: the model
    predicts ``cls``. For a victim on x_adv with ``cls`` the true label, negative means fooled;
    with ``cls`` the target (targeted attacks), positive means the target was hit."""
    true = logits.gather(1, cls.view(-1, 1)).squeeze(1)
    other = logits.scatter(1, cls.view(-1, 1), float("-inf")).amax(1)
    return (true - other).float()


def success_mask(y: torch.Tensor, pred_clean: torch.Tensor, pred_adv: torch.Tensor,
                 target: torch.Tensor | None = None) -> torch.Tensor:
    """Per image (bool N): the victim is right on x and, on x_adv, wrong (untargeted) or
    predicting the target (targeted). The one definition of success in the harness; an
    abstention (:data:`ABSTAIN`) on x_adv is not a success: the defence did not give a wrong label."""
    hit = (pred_adv == target) if target is not None else (pred_adv != y) & (pred_adv != ABSTAIN)
    return (pred_clean == y) & hit


def goal_mask(y: torch.Tensor, pred_adv: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
    """Per image (bool N): on x_adv the victim is wrong (untargeted; an abstention is not wrong)
    or predicts the target (targeted), whatever it said on x: success over *all* images, the
    denominator of papers that report 1 − victim accuracy. Images outside a downstream victim's
    task (label < 0) never count."""
    hit = (pred_adv == target) if target is not None else (pred_adv != y) & (pred_adv != ABSTAIN)
    return hit & (y >= 0)


def wilson_interval(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval (no continuity correction) for k successes out of n, as fractions in
    [0, 1]; ``z`` the standard-normal quantile of the level (default 95%). ``(nan, nan)`` when n = 0.
    The harness's one implementation: the results table, the report and Newcombe's paired interval
    (:func:`advtransfer.analysis.stats.newcombe_paired_ci`) all use it."""
    if n <= 0:
        return (float("nan"), float("nan"))
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, centre - half), min(1.0, centre + half))


def distortion(x: torch.Tensor, x_adv: torch.Tensor) -> dict[str, float]:
    """L∞ and L2 of x_adv − x per sample, summarised: ``linf_max``, ``linf_mean``, ``l2_mean``, ``l2_median``."""
    d = (x_adv - x).flatten(1).double()
    linf = d.abs().amax(1)
    l2 = d.norm(dim=1)
    return {"linf_max": float(linf.max()), "linf_mean": float(linf.mean()),
            "l2_mean": float(l2.mean()), "l2_median": float(l2.median())}


def per_sample_norms(x: torch.Tensor, x_adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(L∞, L2) of x_adv − x per sample, float64 N each (pixel units, [0,1] scale)."""
    d = (x_adv - x).flatten(1).double()
    return d.abs().amax(1), d.norm(dim=1)


def success_counts(y: torch.Tensor, pred_clean: torch.Tensor, pred_adv: torch.Tensor,
                   surrogate_correct: torch.Tensor, target: torch.Tensor | None = None) -> dict[str, float | int]:
    """Counts and rates of one victim on one cell (schema of the results table).

    y: true labels; pred_clean / pred_adv: victim predictions on x and x_adv; surrogate_correct:
    bool mask where the surrogate set is right on x; target: target labels for targeted attacks.
    Success = victim right on x and, on x_adv, wrong (untargeted) or predicting the target.
    """
    clean_ok = pred_clean == y
    adv_ok = pred_adv == y
    hit = (pred_adv == target) if target is not None else ~adv_ok & (pred_adv != ABSTAIN)
    success = success_mask(y, pred_clean, pred_adv, target)
    both = clean_ok & surrogate_correct
    n = len(y)
    n_clean, n_adv, n_succ = int(clean_ok.sum()), int(adv_ok.sum()), int(success.sum())
    n_both, n_tr = int(both.sum()), int((both & hit).sum())
    lo, hi = wilson_interval(n_succ, n_clean)
    nan = float("nan")
    return {
        "n_clean_correct": n_clean, "n_adv_correct": n_adv, "n_success": n_succ,
        "n_both_correct": n_both, "n_transfer_success": n_tr,
        "clean_acc": n_clean / n, "adv_acc": n_adv / n,
        "asr": n_succ / n_clean if n_clean else nan,
        "fooling_rate": (n_clean - n_adv) / n_clean if n_clean else nan,
        "transfer_rate": n_tr / n_both if n_both else nan,
        "asr_ci_low": lo, "asr_ci_high": hi,
        "n_abstain": int((clean_ok & (pred_adv == ABSTAIN)).sum()),
    }
