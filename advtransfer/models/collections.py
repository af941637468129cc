"""Multi-sample surrogates: a zoo entry holding a collection of weights (LGV snapshots, cSGLD
samples) or a SWAG posterior, used as one member of a :class:`~advtransfer.attacks.base.SurrogateSet`.
They live with the models (they load zoo states); the attack layer sees them through the
:class:`~advtransfer.attacks.base.ModelCollection` protocol (``evals_per_call``, ``reset``,
``advance``, ``draw_logits``, ``step_logits``, ``mean_logits``).

Per attack iteration (``SurrogateCall.advance``) a collection draws ``per_step`` = K weight sets:
K = 1 takes the next member of a shuffled cycle (as LGV and cSGLD do); K > 1 makes the set average
the *input gradients of the loss* over the K draws (the loss is averaged over draws, never the
logits), costing K gradient evaluations per call (``evals_per_call``). ``reset`` (start of an
attack) reseeds the draws, so every batch of a cell sees the same sequence. A SWAG collection
samples fresh weights at each draw and refreshes BatchNorm statistics on training images.
Predictions (``mean_logits``) use the mean over all members (SWAG: the mean weights).
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

from ..core.errors import UserError
from .loading import load_networks, load_states

COLLECTION_OPTIONS = {"per_step": "weight sets drawn per attack iteration (gradients averaged)",
                      "seed": "seed of the shuffled cycle / SWAG samples",
                      "scale": "SWAG sample scale s", "mode": "SWAG diag or lowrank",
                      "bn_images": "training images for SWAG BatchNorm refresh (0: none)",
                      "vectorise": "members of a multi-member entry: the K draws of a step as one vmap-ped "
                                   "model over stacked weights (true/false; equal to sequential up to rounding)",
                      "posterior": "gaussian: posterior smoothing around a single trained model (TASAR-style)",
                      "weight_scale": "posterior smoothing: relative weight noise sigma_w, or auto (fitted)",
                      "input_scale": "posterior smoothing: input noise sigma_x in pixels, or auto (fitted)",
                      "fit_drop": "posterior smoothing: accuracy drop the fitted scales may cost (default 0.05)"}
POSTERIOR_OPTIONS = ("posterior", "weight_scale", "input_scale", "fit_drop")


def check_options(options: dict, source: str = "") -> None:
    """Raise a UserError for unknown or invalid collection options."""
    unknown = set(options) - set(COLLECTION_OPTIONS)
    if unknown:
        raise UserError(f"{source}unknown surrogate options {sorted(unknown)}; allowed: {sorted(COLLECTION_OPTIONS)}")
    if "vectorise" in options and not isinstance(options["vectorise"], bool):
        raise UserError(f"{source}vectorise must be true or false, got {options['vectorise']!r}")
    if "per_step" in options and (not isinstance(options["per_step"], int) or options["per_step"] < 1):
        raise UserError(f"{source}per_step must be a positive integer, got {options['per_step']!r}")
    if "mode" in options and options["mode"] not in ("diag", "lowrank"):
        raise UserError(f"{source}SWAG mode must be diag or lowrank, got {options['mode']!r}")
    if "posterior" in options and options["posterior"] != "gaussian":
        raise UserError(f"{source}posterior must be gaussian, got {options['posterior']!r}")
    for k in ("weight_scale", "input_scale"):
        v = options.get(k, "auto")
        if not (v == "auto" or (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0)):
            raise UserError(f"{source}{k} must be auto or a number >= 0, got {v!r}")
    if "fit_drop" in options and not (isinstance(options["fit_drop"], (int, float)) and 0 < options["fit_drop"] < 1):
        raise UserError(f"{source}fit_drop must be a number in (0, 1), got {options['fit_drop']!r}")
    if any(k in options for k in POSTERIOR_OPTIONS[1:]) and "posterior" not in options:
        raise UserError(f"{source}weight_scale, input_scale and fit_drop need posterior: gaussian")


class _Collection(nn.Module):
    """Shared draw bookkeeping: lazy draws per iteration, deterministic reseeding."""

    def __init__(self, per_step: int, seed: int) -> None:
        super().__init__()
        self.per_step = int(per_step)
        self.seed = int(seed)
        self.draw_count = 0  # weight sets drawn since the last reset (for tests and logs)
        self.reset()

    @property
    def evals_per_call(self) -> int:
        return self.per_step

    def reset(self) -> None:
        self._gen = torch.Generator().manual_seed(self.seed)
        self._current: list[nn.Module] | None = None
        self.draw_count = 0
        self._restart()

    def _restart(self) -> None:
        pass

    def advance(self) -> None:
        self._current = None  # drawn lazily at the next forward pass

    def draws(self) -> list[nn.Module]:
        """The K modules of the current iteration."""
        if self._current is None:
            self._current = [self._draw(k) for k in range(self.per_step)]
            self.draw_count += self.per_step
        return self._current

    def _draw(self, k: int) -> nn.Module:
        raise NotImplementedError

    def draw_logits(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """Logits of draw ``k`` (0..K−1) of the current iteration; x pixels in [0,1]."""
        return self.draws()[k](x)

    def step_logits(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Logits of every draw of the current iteration (K tensors N×classes)."""
        return [self.draw_logits(x, k) for k in range(self.per_step)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.draw_logits(x, 0)


class MemberCollection(_Collection):
    """A list of trained weight sets (LGV, cSGLD); each iteration takes the next K of a shuffled
    cycle over the members (a new permutation when one is used up)."""

    def __init__(self, members: Sequence[nn.Module], per_step: int = 1, seed: int = 0,
                 vectorise: bool = False) -> None:
        if not members:
            raise UserError("a collection needs at least one member")
        if not 1 <= per_step <= len(members):
            raise UserError(f"per_step must be within 1..{len(members)} (the collection's members), got {per_step}")
        self._members = list(members)
        super().__init__(per_step, seed)
        self.members = nn.ModuleList(members)
        self.vectorise = bool(vectorise)
        self._stacked: tuple[list[nn.Module], dict, dict] | None = None
        self._base: nn.Module | None = None

    def step_logits(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Logits of every draw of the current iteration. With ``vectorise`` (and K > 1) the K
        drawn members run as one model: their weights stacked, :func:`torch.vmap` over
        :func:`torch.func.functional_call` (same values as one after another, up to float
        rounding; faster only where the hardware rewards wider batches: ``make bench``)."""
        if not self.vectorise or self.per_step == 1:
            return super().step_logits(x)
        from torch.func import functional_call, stack_module_state

        mods = self.draws()
        if self._stacked is None or self._stacked[0] is not mods:
            params, buffers = stack_module_state(mods)
            self._stacked = (mods, params, buffers)
        if self._base is None:
            import copy

            self._base = copy.deepcopy(self._members[0]).to("meta")
            if hasattr(self._base, "channels_last"):
                self._base.channels_last = False  # vmap cannot ask a batched tensor for its memory format
        _, params, buffers = self._stacked
        base = self._base
        out = torch.vmap(lambda p, b, v: functional_call(base, (p, b), (v,)), in_dims=(0, 0, None))(params, buffers, x)
        return list(out.unbind(0))

    def _restart(self) -> None:
        self._queue: list[int] = []
        self.order: list[int] = []  # member indices drawn since reset

    def _draw(self, k: int) -> nn.Module:
        if not self._queue:
            self._queue = torch.randperm(len(self._members), generator=self._gen).tolist()
        i = self._queue.pop(0)
        self.order.append(i)
        return self._members[i]

    @torch.no_grad()
    def mean_logits(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(x) for m in self._members]).mean(0)


class SWAGCollection(_Collection):
    """SWAG posterior: each draw samples θ (diag or low-rank, scale s; see
    :mod:`advtransfer.training.swag`) into a working copy and refreshes its BatchNorm statistics
    on ``bn_x`` (training images, pixels in [0,1]; None skips the refresh)."""

    def __init__(self, build: Callable[[], nn.Module], mean: dict[str, torch.Tensor], sqmean: dict[str, torch.Tensor],
                 devs: Sequence[dict[str, torch.Tensor]], scale: float = 1.5, mode: str = "diag",
                 per_step: int = 1, seed: int = 0, bn_x: torch.Tensor | None = None, device: str = "cpu") -> None:
        if mode not in ("diag", "lowrank"):
            raise UserError(f"SWAG mode must be diag or lowrank, got {mode!r}")
        if mode == "lowrank" and len(devs) < 2:
            raise UserError("low-rank SWAG needs at least 2 deviation columns; train with more collections")
        self.names = list(sqmean)
        self.mean_w = {n: mean[n].to(device) for n in self.names}
        self.std = {n: (sqmean[n].to(device) - self.mean_w[n] ** 2).clamp_min(0).sqrt() for n in self.names}
        self.dev = {n: torch.stack([d[n] for d in devs]).to(device) for n in self.names} if mode == "lowrank" else {}
        self.rank = len(devs)
        self.scale, self.mode, self.bn_x, self.device = float(scale), mode, bn_x, device
        super().__init__(per_step, seed)
        self.mean_model = build().to(device)
        self.mean_model.load_state_dict(mean)
        self.mean_model.eval()
        self.workers = nn.ModuleList([build().to(device) for _ in range(per_step)])
        for w in self.workers:
            w.load_state_dict(mean)
            w.eval()

    @torch.no_grad()
    def sample(self, into: nn.Module) -> nn.Module:
        """Write one posterior sample into ``into``'s parameters (and refresh its BatchNorm)."""
        params = dict(into.named_parameters())
        s = self.scale
        z2 = torch.randn(self.rank, generator=self._gen).to(self.device) if self.mode == "lowrank" else None
        for n in self.names:
            z = torch.randn(self.std[n].shape, generator=self._gen).to(self.device)
            if self.mode == "diag":
                w = self.mean_w[n] + s * self.std[n] * z
            else:
                low = torch.tensordot(z2, self.dev[n], dims=1) / math.sqrt(2 * (self.rank - 1))
                w = self.mean_w[n] + s * (math.sqrt(0.5) * self.std[n] * z + low)
            params[n].copy_(w)
        if self.bn_x is not None:
            from ..training.base import refresh_batchnorm

            refresh_batchnorm(into, self.bn_x)
        return into

    def _draw(self, k: int) -> nn.Module:
        return self.sample(self.workers[k])

    @torch.no_grad()
    def mean_logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.mean_model(x)


def build_collection(name: str, card: dict, options: dict[str, Any], size: str, cache=None,
                     device: str = "cpu", data_dir=None) -> tuple[nn.Module, dict]:
    """The surrogate module of a multi-member or SWAG zoo entry with grid ``options``; returns
    (module, the parameters for the results table: the card's training parameters and the grid's
    options, with the values the collection is drawn with, defaults included)."""
    check_options(options, f"surrogate {name}: ")
    params = {**(card.get("surrogate_params") or {}), **options}
    per_step = int(options.get("per_step", 1))
    seed = int(options.get("seed", 0))
    if card.get("kind") == "swag":
        spec, _card, states = load_states(name, size, cache)
        devs = [states[k] for k in sorted(states) if k.startswith("dev")]
        scale = float(options.get("scale", params.get("scale", 1.5)))
        mode = options.get("mode", params.get("mode", "diag"))
        n_bn = int(options.get("bn_images", 512))
        bn_x = None
        if n_bn > 0:
            from ..data import load_dataset
            from ..training.base import bn_images

            bn_x = bn_images(load_dataset(spec.dataset, "train", data_dir), card["recipe"], n_bn)
        module = SWAGCollection(functools.partial(spec.build, size), states["mean"], states["sqmean"], devs, scale, mode, per_step,
                                seed, bn_x, device)
        params.update(scale=scale, mode=mode, bn_images=n_bn)
    else:
        members = load_networks(name, size, cache, device)
        module = MemberCollection(members, per_step, seed, bool(options.get("vectorise", False)))
        params["K"] = len(members)
    params.update(per_step=per_step, seed=seed)
    return module, params


def is_collection(card: dict) -> bool:
    """Whether a zoo card describes a multi-sample surrogate (several members, or SWAG)."""
    return card.get("kind") == "swag" or len(card.get("members", [""])) > 1


class PosteriorSmoothing(_Collection):
    """Posterior smoothing around one trained surrogate (after TASAR's post-train sampling): each
    draw perturbs every weight multiplicatively, w·(1 + σ_w·z), z ~ N(0, 1) per parameter entry
    (BatchNorm statistics kept), and the input additively, x + σ_x·ξ, ξ ~ N(0, 1) per pixel; an
    attack through it ascends the loss averaged over K = ``per_step`` draws per iteration.

    σ_w and σ_x are fitted after training (:func:`fit_posterior_scales`) or given. Draws come from
    the collection's generator, reseeded at every attack call; the input noise is one C×H×W field
    per draw shared by the batch's images, so an image's result never depends on its batch.
    Predictions (``mean_logits``) use the unperturbed model.
    """

    def __init__(self, model: nn.Module, weight_scale: float, input_scale: float, per_step: int = 1,
                 seed: int = 0) -> None:
        import copy

        if weight_scale < 0 or input_scale < 0:
            raise UserError("posterior smoothing: weight_scale and input_scale must be >= 0")
        self.weight_scale, self.input_scale = float(weight_scale), float(input_scale)
        super().__init__(per_step, seed)
        self.mean_model = model
        self.workers = nn.ModuleList([copy.deepcopy(model).eval() for _ in range(per_step)])
        self._noise: list[torch.Tensor | None] = [None] * per_step

    @torch.no_grad()
    def _draw(self, k: int) -> nn.Module:
        w = self.workers[k]
        for (_, p), (_, p0) in zip(w.named_parameters(), self.mean_model.named_parameters()):
            z = torch.randn(p.shape, generator=self._gen).to(p.device, p.dtype)
            p.copy_(p0 * (1 + self.weight_scale * z))
        self._noise[k] = torch.randn(self._input_shape, generator=self._gen) if self.input_scale > 0 else None
        return w

    _input_shape: tuple[int, ...] = (3, 32, 32)

    def draw_logits(self, x: torch.Tensor, k: int) -> torch.Tensor:
        self._input_shape = tuple(x.shape[1:])
        net = self.draws()[k]
        xi = self._noise[k]
        if xi is not None:
            x = x + self.input_scale * xi.to(x.device, x.dtype)
        return net(x)

    @torch.no_grad()
    def mean_logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.mean_model(x)


@torch.no_grad()
def fit_posterior_scales(model: nn.Module, x: torch.Tensor, y: torch.Tensor, max_drop: float = 0.05,
                         draws: int = 4, seed: int = 0, iters: int = 8) -> tuple[float, float]:
    """(σ_w, σ_x): for each, the largest scale (bisection in [0, 1] for σ_w, relative; [0, 0.5]
    for σ_x, pixel units) at which the model's mean accuracy over ``draws`` draws on the held-out
    images ``x`` (pixels in [0,1]) stays within ``max_drop`` of its clean accuracy."""
    base = float((model(x).argmax(1) == y).float().mean())

    def acc(ws: float, xs: float) -> float:
        coll = PosteriorSmoothing(model, ws, xs, per_step=1, seed=seed)
        total = 0.0
        for _ in range(draws):
            coll.advance()
            total += float((coll.draw_logits(x, 0).argmax(1) == y).float().mean())
        return total / draws

    def largest(f, hi: float) -> float:
        lo = 0.0
        for _ in range(iters):
            mid = (lo + hi) / 2
            if f(mid) >= base - max_drop:
                lo = mid
            else:
                hi = mid
        return lo

    ws = largest(lambda s: acc(s, 0.0), 1.0)
    xs = largest(lambda s: acc(0.0, s), 0.5)
    return ws, xs


def build_posterior(name: str, model: nn.Module, card: dict, options: dict[str, Any], data_dir=None,
                    n_fit: int = 1000) -> tuple[PosteriorSmoothing, dict]:
    """Posterior smoothing around the trained single model ``name`` with grid ``options``; scales
    given as ``auto`` are fitted on ``n_fit`` training images the recipe did not train on (the
    tail of the training split; with a recipe that uses every training image, its last ``n_fit``).
    Returns (module, the parameters for the results table: the grid's options with the values
    used, fitted scales and defaults included)."""
    check_options(options, f"surrogate {name}: ")
    ws, xs = options.get("weight_scale", "auto"), options.get("input_scale", "auto")
    params = {**options, "posterior": "gaussian", "per_step": int(options.get("per_step", 1)),
              "seed": int(options.get("seed", 0))}
    if "auto" in (ws, xs):
        from ..data import load_dataset

        data = load_dataset(card.get("dataset", "cifar10"), "train", data_dir)
        used = int((card.get("recipe") or {}).get("train_subset") or len(data))
        start = used if len(data) - used >= n_fit else len(data) - n_fit
        x, y = data.tensors(list(range(start, start + n_fit)))[:2]
        dev = next(model.parameters()).device
        drop = float(options.get("fit_drop", 0.05))
        fw, fx = fit_posterior_scales(model, x.to(dev), y.to(dev), drop, seed=params["seed"])
        ws = fw if ws == "auto" else ws
        xs = fx if xs == "auto" else xs
        params.update(fit_drop=drop, fit_images=f"train {start}..{start + n_fit - 1}")
    params.update(weight_scale=float(ws), input_scale=float(xs))
    return PosteriorSmoothing(model, float(ws), float(xs), params["per_step"], params["seed"]), params
