"""One grid cell as pure functions: craft adversarial examples once, evaluate any victims on them.

Nothing here touches files; the runner (:mod:`advtransfer.runner`) caches and stores around it,
so a cell can run in-process, in a process pool or as a Slurm array task unchanged.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn as nn

from .attacks.base import Attack, SurrogateSet
from .metrics import distortion, per_sample_l2, success_counts


@dataclass
class CraftResult:
    x_adv: torch.Tensor      # float32 N×C×H×W in [0,1]
    index: torch.Tensor      # int64 N, dataset indices
    target: torch.Tensor | None
    grad_evals: int          # per image
    craft_s: float
    surrogate_correct: torch.Tensor  # bool N: surrogate set right on clean x
    info: dict | None = None  # universal cells: n_craft and the attack's records (bandit counts)


def make_targets(y: torch.Tensor, index: torch.Tensor, seed: int, num_classes: int = 10) -> torch.Tensor:
    """Deterministic random target ≠ y per image, from (seed, dataset index)."""
    out = []
    for yi, i in zip(y.tolist(), index.tolist()):
        h = int.from_bytes(hashlib.blake2b(f"target:{seed}:{i}".encode(), digest_size=4).digest(), "little")
        out.append((yi + 1 + h % (num_classes - 1)) % num_classes)
    return torch.tensor(out, dtype=torch.int64)


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor, batch_size: int = 500, device: str = "cpu") -> torch.Tensor:
    """Top-1 labels of ``model`` on pixels ``x`` in [0,1] (batched)."""
    return torch.cat([model(x[s:s + batch_size].to(device)).argmax(1).cpu() for s in range(0, len(x), batch_size)])


def craft(attack: Attack, surrogates: SurrogateSet, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor,
          batch_size: int = 250, device: str = "cpu", progress=None) -> CraftResult:
    """Run ``attack`` on (x, y) in batches. Targeted attacks aim at :func:`make_targets`."""
    target = make_targets(y, index, attack.seed) if attack.targeted else None
    goal = target if target is not None else y
    outs, evals = [], None
    t0 = time.perf_counter()
    for s in range(0, len(x), batch_size):
        xb = x[s:s + batch_size].to(device)
        outs.append(attack(surrogates, xb, goal[s:s + batch_size].to(device), index[s:s + batch_size]).cpu())
        evals = surrogates.grad_evals if evals is None else evals
        if progress is not None:
            progress(len(xb))
    craft_s = time.perf_counter() - t0
    with torch.no_grad():
        sur_pred = torch.cat([surrogates.predict(x[s:s + batch_size].to(device)).cpu()
                              for s in range(0, len(x), batch_size)])
    return CraftResult(torch.cat(outs).float(), index, target, int(evals or 0), craft_s, sur_pred == y)


def evaluate(victim: nn.Module, x: torch.Tensor, y: torch.Tensor, res: CraftResult,
             clean_pred: torch.Tensor | None = None, batch_size: int = 500, device: str = "cpu"
             ) -> tuple[dict, dict[str, torch.Tensor]]:
    """Evaluate one victim on a crafted cell; returns (row fields, per-sample arrays)."""
    t0 = time.perf_counter()
    if clean_pred is None:
        clean_pred = predict(victim, x, batch_size, device)
    adv_pred = predict(victim, res.x_adv, batch_size, device)
    eval_s = time.perf_counter() - t0
    row = success_counts(y, clean_pred, adv_pred, res.surrogate_correct, res.target)
    row["eval_s"] = eval_s
    hit = (adv_pred == res.target) if res.target is not None else (adv_pred != y)
    per_sample = {"clean_correct": clean_pred == y, "adv_pred": adv_pred, "success": (clean_pred == y) & hit}
    return row, per_sample


def cell_distortion(x: torch.Tensor, res: CraftResult) -> dict[str, float]:
    return distortion(x, res.x_adv)


def run_cell(attack: Attack, surrogates: SurrogateSet, victims: dict[str, nn.Module], x: torch.Tensor,
             y: torch.Tensor, index: torch.Tensor, batch_size: int = 250, device: str = "cpu") -> tuple[CraftResult, list[dict]]:
    """Craft once on the surrogate set, then evaluate every victim on the same x_adv.

    Returns the craft result and one dict per victim (counts, rates, distortion, cost).
    """
    res = craft(attack, surrogates, x, y, index, batch_size, device)
    dist = cell_distortion(x, res)
    rows = []
    for name, model in victims.items():
        row, _ = evaluate(model, x, y, res, batch_size=2 * batch_size, device=device)
        rows.append({"victim": name, **row, **dist, "grad_evals": res.grad_evals, "craft_s": res.craft_s})
    return res, rows


__all__: Sequence[str] = ["CraftResult", "craft", "evaluate", "run_cell", "make_targets", "predict", "per_sample_l2"]
