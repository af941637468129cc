"""Black-box yardstick: HopSkipJump (Chen, Jordan & Wainwright, IEEE S&P 2020), a decision-based attack
on each victim itself (no surrogate, nothing transferred), with an exact per-image query budget. It
lives with the measures, not the attack registry: it answers how far a query attacker must go
(minimal distortion found), beside the transfer directions of the run.

Why our own code: the Adversarial Robustness Toolbox's ``HopSkipJump`` (1.20) installs, but it has
no total query budget (``max_iter``, ``max_eval``, ``init_eval`` and ``init_size`` cap pieces of
the attack, and its queries are not counted), runs image by image, and pulls scikit-learn. Here a
query is one victim forward pass on one image; every image gets exactly ``budget`` queries (fewer
only when it is misclassified already, 1 query, or no starting point is found).

Algorithm (untargeted; pixels in [0,1], d = C·H·W, φ(z) = +1 if the victim misclassifies z else −1),
following the authors' reference implementation, per image and in lock-step over a batch:

- start: uniform noise u ~ U[0,1]^d until φ(u) = +1 (one query per draw, at most ``init_trials``),
  then binary search between x and u to the boundary;
- binary search (to the boundary point x_t, keeping the adversarial end): L2 blends
  (1−α)x + α·x', threshold θ = γ/d^{3/2} on α; L∞ clips x' to the box x ± α, α on [0, ‖x'−x‖∞],
  threshold min(θ·‖x'−x‖∞, θ) with θ = γ/d²; γ = 1;
- gradient-direction estimate at x_t with B_t = min(B₀·√t, B_max) draws (B₀ = 100):
  u_b ~ N(0, I) (L2) or U[−1,1]^d (L∞), normalised to unit L2, probe clip(x_t + δ_t·u_b),
  ĝ = mean_b (φ_b − mean φ)·u_b (baseline-subtracted), δ_t = √d·θ·‖x_t−x‖ (L2) or d·θ·‖x_t−x‖
  (L∞), 0.1 at t = 1; update direction v = ĝ/‖ĝ‖₂ (L2) or sign(ĝ) (L∞);
- geometric step: ξ = ‖x_t − x‖/√t, halved until clip(x_t + ξ·v) is adversarial; then binary
  search back to the boundary.

Every adversarial point the attack queries (boundary points, probes, step candidates) is a
candidate: per image and budget b, ``min_l2`` / ``min_linf`` are the smallest L2 / L∞ distortions
among the adversarial points found within the first b queries (inf if none). Because HSJA's schedule
does not depend on the budget, the numbers at b = 100 equal those of a run stopped at 100 queries,
so one run at the largest budget gives every budget. The last operation before the budget runs
out is cut short (fewer gradient draws, fewer bisection steps), never over-spent.

Speed: the queries of every image of the batch (gradient draws, bisection steps, step candidates)
go to the victim together, in forward passes of ``chunk`` images. On a CPU small chunks are
faster per image than large ones (the activations of a few hundred 32×32 images stay in cache;
the timing is in results/notes/settings-measurements.md), so the default is 128 on a CPU and
4,096 on an accelerator. The chunk changes no query and no count.

Simplifications: untargeted only; no early stop at a target distortion; the random draws are
seeded per (seed, dataset index), so an image's result does not depend on its batch.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from ...core.errors import UserError
from ...core.utils import atomic_path
from ..stats import summarize_blackbox


class _Oracle:
    """Victim queries with exact per-image budgets; records the best distortions per checkpoint."""

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, budget: int,
                 checkpoints: Sequence[int], chunk: int = 128) -> None:
        self.model, self.x, self.y, self.budget, self.chunk = model, x, y, budget, chunk
        self.n = len(x)
        self.count = torch.zeros(self.n, dtype=torch.int64)
        self.cps = torch.tensor(sorted(checkpoints), dtype=torch.int64)
        self.best_l2 = torch.full((len(self.cps), self.n), math.inf, dtype=torch.float64)
        self.best_linf = torch.full((len(self.cps), self.n), math.inf, dtype=torch.float64)

    def left(self, img: torch.Tensor) -> torch.Tensor:
        return self.budget - self.count[img]

    @torch.inference_mode()
    def ask(self, img: torch.Tensor, pts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Is each point adversarial for its image? ``img``: image of each point (grouped
        points of one image keep their order); points past an image's budget are not sent
        (answered = False). Returns (adversarial, answered), both bool."""
        m = len(img)
        answered = torch.zeros(m, dtype=torch.bool)
        adv = torch.zeros(m, dtype=torch.bool)
        if m == 0:
            return adv, answered
        # rank of each point among the points of its image (in order)
        order = torch.argsort(img, stable=True)
        si = img[order]
        first = torch.ones(m, dtype=torch.bool)
        first[1:] = si[1:] != si[:-1]
        start = torch.cummax(torch.where(first, torch.arange(m), torch.zeros(m, dtype=torch.int64)), 0).values
        rank = torch.empty(m, dtype=torch.int64)
        rank[order] = torch.arange(m) - start
        ok = rank < self.left(img)
        if not ok.any():
            return adv, answered
        sel = ok.nonzero().squeeze(1)
        p = pts[sel].clamp(0, 1)
        pred = torch.cat([self.model(p[s:s + self.chunk]).argmax(1).cpu() for s in range(0, len(p), self.chunk)])
        a = pred != self.y[img[sel]]
        adv[sel], answered[sel] = a, True
        qnum = self.count[img[sel]] + rank[sel] + 1          # query number of each point for its image
        self.count.index_add_(0, img[sel], torch.ones(len(sel), dtype=torch.int64))
        if a.any():
            ia = sel[a]
            d = (p[a] - self.x[img[ia]]).flatten(1).double().cpu()
            l2, linf = d.norm(dim=1), d.abs().amax(1)
            for k, cp in enumerate(self.cps.tolist()):
                w = qnum[a] <= cp
                if w.any():
                    ii = img[ia][w]
                    self.best_l2[k].scatter_reduce_(0, ii, l2[w], "amin")
                    self.best_linf[k].scatter_reduce_(0, ii, linf[w], "amin")
        return adv, answered


def _dist(a: torch.Tensor, b: torch.Tensor, norm: str) -> torch.Tensor:
    d = (a - b).flatten(1)
    return d.norm(dim=1) if norm == "l2" else d.abs().amax(1)


def _project(x: torch.Tensor, xp: torch.Tensor, alpha: torch.Tensor, norm: str) -> torch.Tensor:
    a = alpha.view(-1, *([1] * (x.dim() - 1))).to(x.dtype)
    if norm == "l2":
        return (1 - a) * x + a * xp
    return torch.minimum(torch.maximum(xp, x - a), x + a)


def _binary_search(o: _Oracle, img: torch.Tensor, xp: torch.Tensor, norm: str, theta: float) -> torch.Tensor:
    """Boundary points between o.x[img] and adversarial xp (kept adversarial), within budget."""
    x = o.x[img]
    if norm == "l2":
        high = torch.ones(len(img), dtype=torch.float64)
        thr = torch.full((len(img),), theta, dtype=torch.float64)
    else:
        high = _dist(xp, x, "linf").double().cpu()
        thr = torch.minimum(high * theta, torch.full_like(high, theta))
    low = torch.zeros_like(high)
    live = torch.ones(len(img), dtype=torch.bool)
    while True:
        live &= ((high - low) / thr > 1) & (o.left(img) > 0)
        idx = live.nonzero().squeeze(1)
        if len(idx) == 0:
            break
        mid = (high[idx] + low[idx]) / 2
        a, ans = o.ask(img[idx], _project(x[idx], xp[idx], mid, norm))
        high[idx[a]] = mid[a]
        lo_set = ans & ~a
        low[idx[lo_set]] = mid[lo_set]
        live[idx[~ans]] = False
    return _project(x, xp, high, norm)


def default_chunk(device: str | torch.device) -> int:
    """Images per victim forward pass: 128 on a CPU (cache-sized), 4,096 on an accelerator."""
    return 128 if torch.device(device).type == "cpu" else 4096


def _model_device(model: nn.Module) -> str:
    if isinstance(model, _Device):
        return model.device
    p = next(iter(model.parameters()), None)
    return str(p.device) if p is not None else "cpu"


def _gens(index: torch.Tensor, seed: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(int(seed) * 1_000_003 + int(i)) for i in index.tolist()]


def _starting_points(o: _Oracle, todo: torch.Tensor, gens: list[torch.Generator], init_trials: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """HopSkipJump's starting points: for each image of ``todo`` (indices into ``o.x``), uniform
    noise in [0, 1] drawn from its own generator until a draw is adversarial, at most
    ``init_trials`` draws (one query each, within the image's budget). Returns (points: ``o.x``
    with each found image replaced by its adversarial draw, found: bool per image of ``o.x``)."""
    x = o.x
    start = x.clone()
    found = torch.zeros(o.n, dtype=torch.bool)
    for _ in range(init_trials):
        idx = todo[~found[todo] & (o.left(todo) > 0)]
        if len(idx) == 0:
            break
        u = torch.stack([torch.rand(x[0].shape, generator=gens[i]) for i in idx.tolist()])
        a, _ = o.ask(idx, u)
        start[idx[a]] = u[a]
        found[idx[a]] = True
    return start, found


def _direction(o: _Oracle, img: torch.Tensor, cur: torch.Tensor, dist: torch.Tensor, t: int,
               gens: list[torch.Generator], norm: str, theta: float, init_evals: int, max_evals: int
               ) -> torch.Tensor:
    """Iteration ``t``'s estimate of the boundary's gradient direction at the points ``cur`` of
    images ``img`` (``dist``: their distances to the clean images, pixel units, in ``norm``): B =
    min(init_evals·√t, max_evals) random probes per image from its generator, each one query.
    Returns the unit-L2 direction (l2) or its sign (linf), shaped like ``cur``."""
    x = o.x
    d = x[0].numel()
    B = min(int(init_evals * math.sqrt(t)), max_evals)
    delta = torch.full_like(dist, 0.1) if t == 1 else (
        math.sqrt(d) * theta * dist if norm == "l2" else d * theta * dist)
    rv = torch.stack([(torch.randn if norm == "l2" else lambda *s, generator: 2 * torch.rand(*s, generator=generator) - 1)(
        (B, *x.shape[1:]), generator=gens[i]) for i in img.tolist()])          # m×B×C×H×W
    rv = rv / rv.flatten(2).norm(dim=2).clamp_min(1e-12)[..., None, None, None]
    dl = delta.float().view(-1, 1, 1, 1, 1)
    probe = (cur[:, None] + dl * rv).clamp(0, 1)
    rv = (probe - cur[:, None]) / dl
    a, ans = o.ask(img.repeat_interleave(B), probe.flatten(0, 1))
    phi = (2 * a.float() - 1).view(len(img), B)
    w = ans.view(len(img), B).float()
    nb = w.sum(1).clamp_min(1)
    mean_phi = (phi * w).sum(1) / nb
    allsame = ((phi * w).sum(1).abs() == w.sum(1))
    f = torch.where(allsame[:, None], phi, phi - mean_phi[:, None]) * w
    g = (f[..., None, None, None] * rv).sum(1) / nb.view(-1, 1, 1, 1)
    return g / g.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, 1, 1, 1) if norm == "l2" else g.sign()


def _geometric_step(o: _Oracle, img: torch.Tensor, cur: torch.Tensor, v: torch.Tensor, dist: torch.Tensor,
                    t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Iteration ``t``'s step along ``v`` from ``cur``: size dist/√t (pixel units), halved until the
    step is adversarial (at most 64 tries, one query each, within budget). Returns (points: the
    accepted steps, ``cur`` where none was; accepted: bool per image)."""
    xi = (dist / math.sqrt(t)).float()
    cand = cur.clone()
    live = o.left(img) > 0
    ok = torch.zeros(len(img), dtype=torch.bool)
    for _ in range(64):
        idx = (live & ~ok & (o.left(img) > 0)).nonzero().squeeze(1)
        if len(idx) == 0:
            break
        c = (cur[idx] + xi[idx].view(-1, 1, 1, 1) * v[idx]).clamp(0, 1)
        a, ans = o.ask(img[idx], c)
        cand[idx[a]] = c[a]
        ok[idx[a]] = True
        xi[idx[ans & ~a]] /= 2
        live[idx[~ans]] = False
    return cand, ok


def _walk(o: _Oracle, img: torch.Tensor, start: torch.Tensor, norm: str, theta: float,
          gens: list[torch.Generator], init_evals: int, max_evals: int) -> None:
    """HopSkipJump's iterations for images ``img`` (indices into ``o.x``) from their adversarial
    starting points ``start``, until each image's query budget is spent; the oracle records the
    best distortions found."""
    cur = _binary_search(o, img, start, norm, theta)
    dist = _dist(cur, o.x[img], norm).double()
    t = 0
    while True:
        keep = o.left(img) > 0
        img, cur, dist = img[keep], cur[keep], dist[keep]
        if len(img) == 0:
            break
        t += 1
        v = _direction(o, img, cur, dist, t, gens, norm, theta, init_evals, max_evals)
        cand, ok = _geometric_step(o, img, cur, v, dist, t)
        # back to the boundary from the accepted steps; images without an accepted step keep cur
        if ok.any():
            j = ok.nonzero().squeeze(1)
            cur[j] = _binary_search(o, img[j], cand[j], norm, theta)
            dist[j] = _dist(cur[j], o.x[img[j]], norm).double()


def hsja(model: nn.Module, x: torch.Tensor, y: torch.Tensor, budgets: Sequence[int] = (100, 1000),
         norm: str = "l2", index: torch.Tensor | None = None, seed: int = 0, init_trials: int = 100,
         init_evals: int = 100, max_evals: int = 10_000, gamma: float = 1.0,
         chunk: int | None = None) -> dict[str, torch.Tensor]:
    """Untargeted HopSkipJump on images x (N×C×H×W in [0,1], labels y) against ``model`` (pixels in
    [0,1], normalisation inside). Runs to ``max(budgets)`` queries per image; returns CPU tensors:
    ``min_l2`` and ``min_linf`` of shape (len(budgets), N) (best adversarial point found within
    each budget; 0 when the clean image is already misclassified, inf when none found) and
    ``queries`` (N,), the queries spent (= max(budgets) unless the image was misclassified, 1, or
    no start was found within ``init_trials`` draws). ``chunk``: images per victim forward pass
    (default :func:`default_chunk` of the model's device); it changes no query."""
    if norm not in ("l2", "linf"):
        raise UserError(f"HopSkipJump norm must be l2 or linf, got {norm!r}")
    budgets = sorted({int(b) for b in budgets})
    if not budgets or budgets[0] < 1:
        raise UserError(f"query budgets must be positive integers, got {budgets}")
    x = x.float().cpu()
    y = y.cpu()
    n, d = len(x), x[0].numel()
    index = torch.arange(n) if index is None else index
    gens = _gens(index, seed)
    theta = gamma / (d ** 1.5 if norm == "l2" else d ** 2)
    o = _Oracle(model, x, y, budgets[-1], budgets, chunk or default_chunk(_model_device(model)))
    # clean query
    a0, _ = o.ask(torch.arange(n), x)   # misclassified images stop here (distortion 0 recorded by ask)
    todo = (~a0).nonzero().squeeze(1)
    start, found = _starting_points(o, todo, gens, init_trials)
    img = todo[found[todo]]
    if len(img):
        _walk(o, img, start[img], norm, theta, gens, init_evals, max_evals)
    return {"min_l2": o.best_l2.clone(), "min_linf": o.best_linf.clone(), "queries": o.count.clone(),
            "budgets": torch.tensor(budgets)}


def measure_blackbox(run_dir: str | Path | None = None, victims: Iterable[str] | None = None,
                     budgets: Sequence[int] = (100, 1000), n_images: int = 20, norms: Sequence[str] = ("l2",),
                     seed: int = 0, device: str = "cpu", cache=None, data_dir=None,
                     model: nn.Module | None = None, data: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                     log: Callable[[str], None] = lambda s: None) -> pd.DataFrame:
    """HopSkipJump against each victim on the first ``n_images`` images of a run (or on ``data`` =
    (x, y, index) with a ``model``); returns the per-image table and, for a run, writes
    ``RUN/blackbox.parquet`` (one row per victim, variant norm, budget, image: min_l2, min_linf,
    queries_used = min(queries, budget), clean_correct) and ``RUN/blackbox_summary.csv`` (per victim,
    norm and budget: median min L2 / L∞ over clean-correct images, ASR at the grid's ε for the
    L∞ variant). Rows already present (same victim, norm, budget, index) are not recomputed."""
    from ..runs import run_context

    budgets = sorted({int(b) for b in budgets})
    if not budgets or budgets[0] < 1:
        raise UserError(f"--blackbox-budgets must be positive integers, got {budgets}")
    if n_images < 1:
        raise UserError(f"--blackbox-n must be positive, got {n_images}")
    frames = []
    if run_dir is not None:
        from ...grid.runspec import RunSpec
        from ...models import zoo

        res, manifest = run_context(run_dir)
        x, y, index = (t[:n_images] for t in RunSpec.from_manifest(manifest).eval_images(data_dir))
        known = sorted(set(res["victim"]))
        vs = list(victims) if victims else known
        bad = [v for v in vs if v not in known]
        if bad:
            raise UserError(f"victim(s) {', '.join(bad)} not in this run's results (it has: {', '.join(known)})")
        size = {v: str(s) for v, s in res.groupby("victim")["zoo_size"].first().items()}
        path = Path(run_dir) / "blackbox.parquet"
        old = pd.read_parquet(path) if path.is_file() else pd.DataFrame()
        models = ((v, lambda v=v: zoo.load_model(v, size[v], cache, device, member=0)) for v in vs)
    else:
        if model is None or data is None:
            raise UserError("measure_blackbox needs a run folder, or a model and data=(x, y, index)")
        x, y, index = data
        x, y, index = x[:n_images], y[:n_images], index[:n_images]
        old = pd.DataFrame()
        models = iter([("model", lambda: model)])
    for v, get in models:
        m = None
        for nm in norms:
            if len(old) and len(old[(old.victim == v) & (old.norm == nm) & old.budget.isin(budgets)
                                    & old["index"].isin(index.numpy())]) == len(budgets) * len(index):
                continue
            log(f"HopSkipJump {nm} against {v}: {len(x)} images, budgets {budgets}")
            m = get() if m is None else m
            with torch.no_grad():
                clean_ok = m(x.to(device)).argmax(1).cpu() == y
            out = hsja(_Device(m, device), x, y, budgets, nm, index, seed)
            for k, b in enumerate(budgets):
                frames.append(pd.DataFrame({
                    "victim": v, "norm": nm, "budget": b, "index": index.numpy(),
                    "clean_correct": clean_ok.numpy(), "min_l2": out["min_l2"][k].numpy(),
                    "min_linf": out["min_linf"][k].numpy(),
                    "queries_used": torch.clamp(out["queries"], max=b).numpy()}))
            if run_dir is not None:   # after each victim and variant, so a long run keeps what it did
                _write(run_dir, _merge(old, frames), res)
    table = _merge(old, frames)
    if run_dir is not None:
        _write(run_dir, table, res)
    return table


def _merge(old: pd.DataFrame, frames: list[pd.DataFrame]) -> pd.DataFrame:
    new = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    table = pd.concat([old, new], ignore_index=True) if len(old) else new
    if len(table):
        table = table.drop_duplicates(["victim", "norm", "budget", "index"], keep="last").reset_index(drop=True)
    return table


def _write(run_dir, table: pd.DataFrame, res: pd.DataFrame) -> None:
    with atomic_path(Path(run_dir) / "blackbox.parquet") as tmp:
        table.to_parquet(tmp, index=False)
    summ = summarize_blackbox(table, eps=sorted(set(res["eps"]))) if len(table) else pd.DataFrame()
    with atomic_path(Path(run_dir) / "blackbox_summary.csv") as tmp:
        summ.to_csv(tmp, index=False)


class _Device(nn.Module):
    """Moves queries to the model's device and logits back to the CPU."""

    def __init__(self, model: nn.Module, device: str) -> None:
        super().__init__()
        self.model, self.device = model, device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.to(self.device)).cpu()


__all__ = ["hsja", "measure_blackbox"]
