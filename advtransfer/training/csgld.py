"""cSGLD (Zhang et al. 2020), as used for transferable attacks by Gubri et al. (2022): a cyclical
cosine learning rate lr_k = ½·lr_max·(cos(π·(k mod c)/c) + 1) over ``cycles`` cycles of c steps,
SGD without momentum, Langevin noise in the last ``noise_fraction`` of each cycle, and
``samples_per_cycle`` weight samples taken evenly over that noisy part (members ``c0s0``, ...).

Noise: after each step in the noisy part, θ += N(0, 2·lr·T/N_train) per weight, the update of
Zhang et al.'s code with the data term scaled to a mean loss (N_train = training images,
T = ``temperature``).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from ..data import Split
from ..core.errors import UserError
from .base import TrainOutput, training_subset, register_method
from .context import TrainingContext
from .resume import ResumeHooks
from .standard import fit, snapshot_dtype, stored_copy


def csgld_lr(step: int, total: int, lr_max: float, cycles: int) -> float:
    """Learning rate at optimiser step ``step`` (0-based) of ``total``: a cosine from lr_max to 0
    restarting every total/cycles steps."""
    c = total / cycles
    pos = (step % c) / c
    return 0.5 * lr_max * (math.cos(math.pi * pos) + 1)


def cycle_position(step: int, total: int, cycles: int) -> float:
    """Fraction in [0,1) of its cycle at which optimiser step ``step`` (0-based) runs."""
    c = total / cycles
    return (step % c) / c


def sample_steps(total: int, cycles: int, per_cycle: int, noise_fraction: float) -> list[int]:
    """Steps (1-based, after the step) at which samples are saved: ``per_cycle`` evenly spaced over
    the noisy last part of each cycle, the last at the cycle's end."""
    c = total / cycles
    marks = []
    for k in range(cycles):
        end = (k + 1) * c
        for j in range(per_cycle):
            marks.append(max(1, round(end - j * noise_fraction * c / per_cycle)))
    return sorted(set(marks))


@register_method("csgld", version=1)
def train_csgld(net: nn.Module, recipe: dict, data: Split, ctx: TrainingContext) -> TrainOutput:
    """Recipe: ``lr`` (lr_max), ``epochs`` (total), ``cycles``, ``samples_per_cycle``,
    ``noise_fraction`` (default 0.2), ``temperature`` (default 1), ``momentum`` should be 0.
    ``snapshot_dtype: float16`` keeps the samples in half precision, as LGV's recipe does (the
    run is float32; only the stored copies are rounded, at most 2^-11 of each weight)."""
    cycles = int(recipe.get("cycles", 1))
    per = int(recipe.get("samples_per_cycle", 3))
    frac = float(recipe.get("noise_fraction", 0.2))
    temp = float(recipe.get("temperature", 1.0))
    if cycles < 1 or per < 1 or not 0 < frac <= 1:
        raise UserError("cSGLD needs cycles ≥ 1, samples_per_cycle ≥ 1 and 0 < noise_fraction ≤ 1")
    dtype = snapshot_dtype(recipe, "cSGLD", ctx.name)
    lr_max = float(recipe["lr"])
    n_train = len(training_subset(data, recipe))
    gen = torch.Generator().manual_seed(int(recipe.get("seed", 0)) + 7919)
    samples: dict = {}
    marks: list[int] = []
    lrs: list[float] = []

    def lr_fn(step: int, total: int) -> float:
        lr = csgld_lr(step, total, lr_max, cycles)
        lrs.append(lr)
        return lr

    def after_step(step: int, total: int, net: nn.Module, lr: float) -> None:
        if not marks:
            marks.extend(sample_steps(total, cycles, per, frac))
        if cycle_position(step - 1, total, cycles) >= 1 - frac and temp > 0:
            std = math.sqrt(2 * lr * temp / n_train)
            with torch.no_grad():
                for p in net.parameters():
                    p.add_(torch.randn(p.shape, generator=gen).to(p.device) * std)
        if step in marks:
            k = min(cycles - 1, int((step - 1) // (total / cycles)))
            samples[f"c{k}s{sum(n.startswith(f'c{k}s') for n in samples)}"] = stored_copy(net, dtype)

    def get_state() -> dict:  # what a resumed run needs besides the loop's state (resume.py)
        return {"noise_gen": gen.get_state(), "samples": dict(samples), "lrs": list(lrs)}

    def set_state(state: dict) -> None:
        gen.set_state(state["noise_gen"])
        samples.clear(), samples.update(state["samples"])
        lrs[:] = state["lrs"]

    out = fit(net, recipe, data, ctx, lr_fn=lr_fn, after_step=after_step,
              resume_hooks=ResumeHooks(get_state, set_state))
    meta = {**out.meta, "lr_trace": [round(v, 6) for v in lrs[:: max(1, len(lrs) // 200)]],
            "surrogate_params": {"K": len(samples), "cycles": cycles, "samples_per_cycle": per,
                                 "noise_fraction": frac, "temperature": temp, "lr_max": lr_max,
                                 "epochs": int(recipe["epochs"]),
                                 **({"snapshot_dtype": "float16"} if dtype is not None else {})}}
    return TrainOutput(samples, meta)
