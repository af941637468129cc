"""Attack base classes: threat model, surrogate set that counts gradient evaluations, registry.

Conventions: images x are float tensors N×C×H×W with pixels in [0,1]; ε is in that space (like
8/255); the attacker *ascends* its objective (untargeted: cross-entropy of the true label;
targeted: minus cross-entropy of the target label); every norm is per sample.
"""
from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..core.errors import UserError
from ..core.registry import Registry
from ..core.utils import parse_fraction
from .collection import ModelCollection
from .params import CellView, Param

ENSEMBLE_MODES = ("logit", "loss", "prob")
#: attacker losses: ``ce`` (cross-entropy), ``logit`` (the target's logit, or minus the true
#: class's: Zhao et al. 2021), ``potrip`` (Poincaré distance to the target plus a triplet term
#: pushing away from the true class: Li et al. 2020; targeted only)
LOSSES = ("ce", "logit", "potrip")
#: how a targeted attack picks its target per image (or a class index for one fixed target):
#: ``random`` (seeded per image, never the true class), ``least_likely`` (the surrogate set's),
#: ``next`` ((label + 1) mod classes: a fixed rule, LinBP's CIFAR-10 one)
TARGET_MODES = ("random", "least_likely", "next")

#: Attack kinds. Every kind implements the one craft protocol (:meth:`Attack.craft`); the runner
#: never branches on it. ``gradient``: per-image iterative/one-step attacks; ``ensemble``: per-image
#: attacks whose update uses the surrogate set's members separately; ``universal``: one perturbation
#: crafted on training images and applied to every test image; ``feature``: per-image attacks
#: whose objective lives at an intermediate layer (ILA, FIA, NAA, DTA, representation-space);
#: ``generative``: a perturbation generator trained on training images, then applied to each test
#: image in one forward pass (CDA, BIA, FACL, PDCL, CGNC, Dual-Flow: :mod:`.generative`).
ATTACK_KINDS = ("gradient", "ensemble", "universal", "generative", "feature")
#: kinds that perturb each image on its own (matched baselines and the generic attack tests apply)
PER_IMAGE_KINDS = ("gradient", "ensemble", "feature")


def common_parameters(norms: Sequence[str], default_steps: int) -> dict[str, Param]:
    """The parameters every attack takes (see :class:`advtransfer.attacks.base.Attack`)."""
    return {
        "eps": Param(8 / 255, "number", lo=0, lo_open=True, doc="radius ε in pixel space, e.g. 8/255 "
                                                                 "(at most 1 under linf)"),
        "norm": Param(norms[0], "choice", choices=tuple(norms), doc="threat model"),
        "steps": Param(default_steps, "int", lo=1, none_ok=True, doc="iterations"),
        "alpha": Param(None, "number", lo=0, lo_open=True, none_ok=True, doc="step size in pixel space "
                                                                               "(default per attack, e.g. ε/steps)"),
        "targeted": Param(False, "bool", doc="aim at a target class instead of away from the true one"),
        "seed": Param(0, "int", doc="seed of the attack's randomness, drawn per image from (seed, dataset index)"),
        "ensemble": Param("logit", "choice", choices=ENSEMBLE_MODES, doc="how a surrogate set's members combine"),
        "loss": Param("ce", "choice", choices=LOSSES, doc="attacker loss"),
        "target": Param("random", "target", doc="how a targeted attack picks its target"),
    }


@dataclass
class CraftContext:
    """What a cell gives an attack to craft on.

    ``x``: evaluation images N×C×H×W in [0,1] (CPU); ``y``: their true labels (N); ``index``: their
    dataset indices (N, int64); ``train_data(n)``: the first ``n`` training images as (x, y, index),
    for kinds that learn on training data (universal, generative); ``progress(k)``: called with the
    number of images finished; ``load_model(name)``: a zoo model the attack uses besides the
    surrogates (named by a parameter such as ``clip``; the grid puts its checksum in the cell id).
    """

    x: torch.Tensor
    y: torch.Tensor
    index: torch.Tensor
    batch_size: int = 250
    device: str = "cpu"
    train_data: Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None
    progress: Callable[[int], None] | None = None
    precision: str = "fp32"  # autocast of the surrogate passes (advtransfer.core.accel)
    log: Callable[[str], None] | None = None  # told of batches halved on out-of-memory
    load_model: Callable[[str], nn.Module] | None = None  # a zoo model by name (a generator's CLIP model)


@dataclass
class Crafted:
    """The output of :meth:`Attack.craft`, cached by cell id.

    ``x_adv``: float32 N'×C×H×W in [0,1]; ``index``: the N' dataset indices crafted (the context's
    images, or a subset in the same order, e.g. a targeted UAP leaves out its target class);
    ``target``: target labels (N') for targeted attacks; ``grad_evals``: surrogate forward+backward
    passes per image; ``craft_s``: wall time; ``tensors``: extra tensors cached with the cell (a
    universal δ); ``fields``: the kind's extra row fields (JSON-able values; see
    :mod:`advtransfer.core.schema` for their defaults in other rows).
    """

    x_adv: torch.Tensor
    index: torch.Tensor
    target: torch.Tensor | None
    grad_evals: int
    craft_s: float
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Perturbed:
    """The result of one attack call (:meth:`Attack.run`).

    ``x_adv``: N×C×H×W in [0,1]; ``grad_evals``: surrogate forward+backward passes per image spent
    by the call (per crafting image for kinds that learn on the images); ``extras``: what a learning
    kind learned (universal: ``delta`` 1×C×H×W and ``info``; generative: ``generator`` and ``info``).
    """

    x_adv: torch.Tensor
    grad_evals: int
    extras: dict[str, Any] = field(default_factory=dict)


def make_targets(y: torch.Tensor, index: torch.Tensor, seed: int, num_classes: int = 10) -> torch.Tensor:
    """Deterministic random target ≠ y per image, drawn from (seed, dataset index)."""
    out = []
    for yi, i in zip(y.tolist(), index.tolist()):
        h = int.from_bytes(hashlib.blake2b(f"target:{seed}:{i}".encode(), digest_size=4).digest(), "little")
        out.append((yi + 1 + h % (num_classes - 1)) % num_classes)
    return torch.tensor(out, dtype=torch.int64)


def next_targets(y: torch.Tensor, num_classes: int = 10) -> torch.Tensor:
    """The target rule ``next``: (y + 1) mod ``num_classes`` per image (never the true class)."""
    return (y.to(torch.int64) + 1) % num_classes


@dataclass(frozen=True)
class Objective:
    """What one attack call ascends, given with the call (never stored on the surrogate set).

    ``loss``: one of :data:`LOSSES`; ``ensemble``: one of :data:`ENSEMBLE_MODES` (how the members'
    outputs are combined); ``targeted``: the labels given to each gradient are targets, whose loss
    the attacker descends (untargeted: true labels, ascended); ``y_true``: the batch's true labels
    (N, int64; Po+Trip's triplet term needs them in a targeted call).
    """

    loss: str = "ce"
    ensemble: str = "logit"
    targeted: bool = False
    y_true: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise UserError(f"unknown loss {self.loss!r}; use one of {', '.join(LOSSES)}")
        if self.ensemble not in ENSEMBLE_MODES:
            raise UserError(f"unknown ensemble mode {self.ensemble!r}; use one of {', '.join(ENSEMBLE_MODES)}")


class SurrogateSet:
    """One or several surrogate models attacked together: an immutable value (the models, their
    names and weights). Members may be plain modules or :class:`ModelCollection` s.

    It computes no loss by itself: :meth:`bind` pairs it with an :class:`Objective` for one attack
    call, and the returned :class:`SurrogateCall` takes gradients and counts them. The set itself
    only predicts (forward passes, never counted).
    """

    __slots__ = ("models", "names", "weights", "_collection")

    models: tuple[nn.Module, ...]
    names: tuple[str, ...]
    weights: torch.Tensor

    def __init__(self, models: nn.Module | Sequence[nn.Module], names: Sequence[str] | None = None,
                 weights: Sequence[float] | None = None) -> None:
        ms = (models,) if isinstance(models, nn.Module) else tuple(models)
        if not ms:
            raise UserError("a surrogate set needs at least one model")
        w = torch.ones(len(ms)) if weights is None else torch.tensor(list(weights), dtype=torch.float32)
        if len(w) != len(ms) or (w < 0).any() or w.sum() <= 0:
            raise UserError("ensemble weights must be non-negative, one per model, not all zero")
        set_ = object.__setattr__
        set_(self, "models", ms)
        set_(self, "names", tuple(names) if names is not None else tuple(f"m{i}" for i in range(len(ms))))
        set_(self, "weights", w / w.sum())
        set_(self, "_collection", tuple(isinstance(m, ModelCollection) for m in ms))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a SurrogateSet is immutable (cannot set {name!r}); give the loss, ensemble mode "
                             f"and labels as an Objective with the call")

    def __setstate__(self, state: tuple[None, dict[str, Any]]) -> None:
        """Unpickling and copying fill the slots once, as :meth:`__init__` does."""
        for name, value in state[1].items():
            object.__setattr__(self, name, value)

    def __len__(self) -> int:
        return len(self.models)

    def is_collection(self, i: int) -> bool:
        """Whether member ``i`` is a :class:`ModelCollection`."""
        return self._collection[i]

    def evals_per_call(self, i: int) -> int:
        """Gradient evaluations one call through member ``i`` costs (a collection averaging K draws costs K)."""
        return int(self.models[i].evals_per_call) if self._collection[i] else 1

    def logits(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """Logits (N×classes) of member ``i`` at the current draw, on pixels x in [0,1]."""
        return self.models[i](x)

    def step_logits(self, x: torch.Tensor, i: int, K: int) -> list[torch.Tensor]:
        """Logits of member ``i`` for draws 0..K−1 of the current iteration (a plain model, or a
        collection with fewer draws, repeats its outputs)."""
        outs = self.models[i].step_logits(x) if self.evals_per_call(i) > 1 else [self.logits(x, i)]
        return [outs[k % len(outs)] for k in range(K)]

    @torch.no_grad()
    def mean_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The ensemble's weighted mean logits (N×classes; collections predict with all their
        members; no gradient counted)."""
        return sum(w * (m.mean_logits(x) if c else m(x)) for w, m, c in zip(self.weights, self.models, self._collection))

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Labels (N) predicted by the ensemble's weighted mean logits (no gradient counted)."""
        return self.mean_logits(x).argmax(1)

    def bind(self, objective: Objective | None = None) -> "SurrogateCall":
        """The set as one attack call sees it, with ``objective`` (default: untargeted
        cross-entropy of the logit ensemble). Starts the call: collections reseed their draws."""
        return SurrogateCall(self, objective if objective is not None else Objective())


class SurrogateCall:
    """One attack call on a :class:`SurrogateSet` with its :class:`Objective`: takes gradients,
    counts them, and steps the collections' draws. Made by :meth:`SurrogateSet.bind` at the start
    of every call and dropped at its end, so nothing of a call outlives it.

    ``grad_evals`` counts, per image, the forward+backward passes through single surrogate models
    spent in this call: a gradient of an n-model ensemble loss costs n (K for a collection
    averaging K draws). ``step`` is the number of iterations begun (:meth:`advance`).
    """

    def __init__(self, surrogates: SurrogateSet, objective: Objective) -> None:
        self.surrogates = surrogates
        self.objective = objective
        self.grad_evals = 0
        self.step = 0
        for m, c in zip(surrogates.models, surrogates._collection):
            if c:
                m.reset()

    # the set's read-only parts, so attacks read one object
    @property
    def models(self) -> tuple[nn.Module, ...]:
        return self.surrogates.models

    @property
    def names(self) -> tuple[str, ...]:
        return self.surrogates.names

    @property
    def weights(self) -> torch.Tensor:
        return self.surrogates.weights

    def __len__(self) -> int:
        return len(self.surrogates)

    def evals_per_call(self, i: int) -> int:
        return self.surrogates.evals_per_call(i)

    def logits(self, x: torch.Tensor, i: int) -> torch.Tensor:
        return self.surrogates.logits(x, i)

    def mean_logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.surrogates.mean_logits(x)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.surrogates.predict(x)

    def advance(self) -> None:
        """Mark the start of a new attack iteration (collections draw their next members)."""
        self.step += 1
        for m, c in zip(self.surrogates.models, self.surrogates._collection):
            if c:
                m.advance()

    def count(self, evals: int) -> None:
        """Add ``evals`` gradient evaluations per image spent outside :meth:`grad` (an attack that
        backpropagates through the members itself, e.g. at a feature layer)."""
        self.grad_evals += int(evals)

    def loss(self, x: torch.Tensor, y: torch.Tensor, idx: Sequence[int] | None = None,
             weights: torch.Tensor | None = None,
             transform: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """Per-sample attacker objective (N,) over members ``idx`` (all by default), to ascend:
        the objective's loss of labels ``y`` (N), negated when targeted.

        ``weights``: one weight per member (shape n) or one row per sample (shape N×n, for
        attacks such as AdaEA that weight the models per image); renormalised over ``idx``.
        ``transform`` (e.g. input diversity) is applied to x (pixels in [0,1]) before the forward pass.
        """
        S = self.surrogates
        idx = list(range(len(S))) if idx is None else list(idx)
        if transform is not None:
            x = transform(x)
        # weights: (n,) shared, or (N, n) per image (AdaEA)
        w = (S.weights if weights is None else weights)[..., idx].to(x.dtype)
        w = w / w.sum(-1, keepdim=True)
        K = max(S.evals_per_call(i) for i in idx)
        if K == 1:
            ce = self._combine([S.logits(x, i) for i in idx], w, y)
        else:
            # A collection drawing K weight sets per iteration: the objective is the mean over
            # draws k of the ensemble objective with draw k, so its input gradient is the mean
            # of the K draws' gradients (plain members are evaluated once).
            per = [S.step_logits(x, i, K) for i in idx]
            ce = sum(self._combine([p[k] for p in per], w, y) for k in range(K)) / K
        return -ce if self.objective.targeted else ce

    def _combine(self, outs: list[torch.Tensor], w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-sample loss of the ensemble of ``outs`` under the objective's mode and loss, signed
        like cross-entropy (the attacker ascends it untargeted and descends it targeted); ``w`` is
        (n,) or (N, n)."""
        obj = self.objective
        wcol = [w[..., k] for k in range(len(outs))]  # scalar or N-vector per member
        wrow = [c.unsqueeze(-1) if c.dim() else c for c in wcol]  # broadcast over classes
        if obj.loss == "logit":  # linear in the logits: the three ensemble modes coincide
            return -sum(wi * o for wi, o in zip(wrow, outs)).gather(1, y[:, None]).squeeze(1)
        if obj.loss == "potrip":
            return potrip_loss(sum(wi * o for wi, o in zip(wrow, outs)), y, obj.y_true)
        if obj.ensemble == "logit":
            return F.cross_entropy(sum(wi * o for wi, o in zip(wrow, outs)), y, reduction="none")
        if obj.ensemble == "loss":
            return sum(wi * F.cross_entropy(o, y, reduction="none") for wi, o in zip(wcol, outs))
        p = sum(wi * F.softmax(o, 1) for wi, o in zip(wrow, outs))
        return F.nll_loss(torch.log(p.clamp_min(1e-12)), y, reduction="none")

    def grad(self, x: torch.Tensor, y: torch.Tensor, idx: Sequence[int] | None = None,
             weights: torch.Tensor | None = None,
             transform: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """Input gradient of the summed per-sample objective (:meth:`loss`) at ``x`` (same shape
        as x, N×C×H×W).

        Summing (not averaging) keeps each sample's gradient independent of the batch size.
        Adds one gradient evaluation per member used (K for a member averaging K draws).
        """
        S = self.surrogates
        idx = list(range(len(S))) if idx is None else list(idx)
        xg = x.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            loss = self.loss(xg, y, idx, weights, transform).sum()
            (g,) = torch.autograd.grad(loss, xg)
        self.grad_evals += sum(S.evals_per_call(i) for i in idx)
        return g.detach()


def potrip_loss(logits: torch.Tensor, target: torch.Tensor, y_true: torch.Tensor | None,
                lam: float = 0.01, margin: float = 0.007, xi: float = 1e-5) -> torch.Tensor:
    """Po+Trip (Li et al. 2020), per sample, to minimise: the Poincaré distance between the
    L1-normalised logits u and the clipped one-hot target v = max(onehot(t) − ξ, 0), plus
    λ·max(D(z, t) − D(z, y) + γ, 0) with D(z, c) = 1 − |z_c|/‖z‖₂ (cosine distance to a one-hot)."""
    if y_true is None:
        raise UserError("loss potrip needs the images' true labels (its triplet term); it is a "
                        "targeted loss: use it with targeted: true")
    n_cls = logits.shape[1]
    u = logits / logits.abs().sum(1, keepdim=True).clamp_min(1e-12)
    v = (F.one_hot(target, n_cls).to(logits.dtype) - xi).clamp_min(0)
    duv = ((u - v) ** 2).sum(1)
    denom = ((1 - (u ** 2).sum(1)) * (1 - (v ** 2).sum(1))).clamp_min(1e-12)
    poincare = torch.acosh(1 + 2 * duv / denom)
    zn = logits.norm(dim=1).clamp_min(1e-12)
    d_t = 1 - logits.gather(1, target[:, None]).squeeze(1).abs() / zn
    d_y = 1 - logits.gather(1, y_true[:, None]).squeeze(1).abs() / zn
    return poincare + lam * (d_t - d_y + margin).clamp_min(0)


class Attack:
    """Base class. Per-image kinds implement :meth:`perturb` and :meth:`grad_evals_formula`; other
    kinds override :meth:`craft` (the one protocol the runner calls).

    Class attributes set by :func:`register_attack`: ``name``, ``kind`` (one of
    :data:`ATTACK_KINDS`) and ``version`` — an integer that enters every cell id and the table's
    ``attack_version``: bump it whenever the attack's output changes, so cached examples crafted by
    older code are never reused (``tests/test_attack_versions.py`` fingerprints every attack).

    Parameters common to all attacks: ``eps`` (ε in pixel space, e.g. 8/255), ``norm``
    (``linf``/``l2``), ``steps``, ``alpha`` (step size; default per attack), ``targeted``,
    ``seed`` (for attacks with randomness: drawn per image from (seed, dataset index), so results
    do not depend on batch composition), ``ensemble`` (how a surrogate set is combined).
    """

    name = "attack"
    kind = "gradient"
    version = 0
    #: True for attacks that hook into the surrogate's layers: they never get a compiled model
    #: (advtransfer.core.accel), whose graph would not see hooks added after compilation
    hooks_model = False
    norms: tuple[str, ...] = ("linf", "l2")
    default_steps = 10
    #: the attack's own parameters (beyond :func:`common_parameters`), one declared
    #: :class:`~.params.Param` each: default, type and allowed values. Subclasses extend their
    #: base's (``{**Base.parameters, "n_copies": Param(20, "int", lo=1)}``).
    parameters: dict[str, Param] = {}
    #: the parameters' defaults (derived from ``parameters``; a class that sets only this, as
    #: older plug-in code may, gets parameters whose types are inferred from the defaults)
    extra_defaults: dict[str, Any] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__
        if "extra_defaults" in own and "parameters" not in own:
            cls.parameters = {k: Param.inferred(v) for k, v in own["extra_defaults"].items()}
        else:
            cls.extra_defaults = {k: p.default for k, p in cls.parameters.items()}

    @classmethod
    def declared(cls) -> dict[str, Param]:
        """Every parameter the attack takes: the common ones, then its own."""
        return {**common_parameters(cls.norms, cls.default_steps), **cls.parameters}

    def __init__(self, eps: float | str = 8 / 255, norm: str = "linf", steps: int | None = None,
                 alpha: float | str | None = None, targeted: bool = False, seed: int = 0,
                 ensemble: str = "logit", loss: str = "ce", target: str | int = "random", **kwargs: Any) -> None:
        self.eps = parse_fraction(eps, "eps")
        if not 0 < self.eps <= 1 and norm == "linf":
            raise UserError(f"eps {eps} is outside (0, 1]; give it in pixel space like 8/255")
        if not self.eps > 0:
            raise UserError(f"eps {eps} must be positive")
        if norm not in self.norms:
            raise UserError(f"attack {self.name!r} supports norms {', '.join(self.norms)}, not {norm!r}")
        self.norm = norm
        steps = self.default_steps if steps is None else steps
        if not _is_int(steps) or steps < 1:
            raise UserError(f"attack {self.name!r}: steps must be an integer >= 1, got {steps!r}")
        self.steps = int(steps)
        self.alpha = parse_fraction(alpha, "alpha") if alpha is not None else self.default_alpha()
        if not (math.isfinite(self.alpha) and self.alpha > 0):
            raise UserError(f"attack {self.name!r}: alpha (step size) must be a positive number like 2/255, got {alpha!r}")
        if not isinstance(targeted, bool):
            raise UserError(f"attack {self.name!r}: targeted must be true or false, got {targeted!r}")
        self.targeted = targeted
        if not _is_int(seed):
            raise UserError(f"attack {self.name!r}: seed must be an integer, got {seed!r}")
        self.seed = int(seed)
        if ensemble not in ENSEMBLE_MODES:
            raise UserError(f"unknown ensemble mode {ensemble!r}; use one of {', '.join(ENSEMBLE_MODES)}")
        self.ensemble = ensemble
        if loss not in LOSSES:
            raise UserError(f"attack {self.name!r}: unknown loss {loss!r}; use one of {', '.join(LOSSES)}")
        if loss == "potrip" and not targeted:
            raise UserError(f"attack {self.name!r}: loss potrip is a targeted loss; add targeted: true or use ce/logit")
        self.loss = loss
        if not (target in TARGET_MODES or (_is_int(target) and target >= 0)):
            raise UserError(f"attack {self.name!r}: target must be {', '.join(TARGET_MODES)} or a class index "
                            f"(a grid also takes target: all), got {target!r}")
        self.target = target
        self.extra = self.init_extra(**kwargs)

    # --- hooks for subclasses -------------------------------------------------------------
    def default_alpha(self) -> float:
        return self.eps / self.steps

    def init_extra(self, **kwargs: Any) -> dict[str, Any]:
        """Consume attack-specific keyword arguments: ``extra_defaults`` overridden by ``kwargs``
        (unknown names are a :class:`UserError`). Subclasses validate the values after calling it."""
        return take_extra(self, kwargs)

    def perturb(self, S: SurrogateCall, x: torch.Tensor, y: torch.Tensor,
                index: torch.Tensor) -> torch.Tensor | Perturbed:
        """The per-image kinds' work: x_adv (N×C×H×W in [0,1]) for images x with labels y (targets
        when targeted) on the call ``S``, whose gradient evaluations count the cost. Per-call
        state lives in locals, never on the attack. A kind that learns (universal, generative)
        returns a :class:`Perturbed` with its own cost and what it learned."""
        raise NotImplementedError

    def grad_evals_formula(self, n_models: int) -> int:
        """Gradient evaluations per image this attack spends on ``n_models`` plain models."""
        return self.steps * n_models

    def craft_passes(self, n_models: int, n_images: int) -> int:
        """Surrogate forward+backward image-passes a cell spends crafting ``n_images`` test images
        on ``n_models`` plain models (the dry run's estimate; kinds that learn on training images
        spend theirs there, whatever ``n_images`` is)."""
        return self.grad_evals_formula(n_models) * n_images

    @property
    def batch_dependent(self) -> bool:
        """Whether an image's result depends on the other images of its crafting batch (randomness
        drawn per batch, e.g. a library attack under ``rng: batch``). Such a cell's id holds the
        grid's ``batch_size``, and its crafting batch is never halved on out-of-memory (that would
        change the examples): the error says to lower the batch size instead. Per-image attacks of
        the harness draw their randomness per image: False."""
        return False

    # --- public API -------------------------------------------------------------------------
    def params(self) -> dict[str, Any]:
        """Resolved parameters (JSON-able), as recorded in the results table."""
        out = {"eps": self.eps, "norm": self.norm, "steps": self.steps, "alpha": self.alpha,
               "targeted": self.targeted, "seed": self.seed, "ensemble": self.ensemble, **self.extra}
        # recorded only when not the default, so the cell ids of earlier runs stay valid
        if self.loss != "ce":
            out["loss"] = self.loss
        if self.targeted and self.target != "random":
            out["target"] = self.target
        return out

    def value(self, key: str) -> Any:
        """The resolved value of declared parameter ``key`` (its own parameters from ``extra``)."""
        return self.extra[key] if key in self.extra else getattr(self, key)

    def uses(self, key: str) -> bool:
        """Whether the attack reads parameter ``key`` with its other values (a generator's
        ``layer`` only under the feature objective): a special layer (``auto``) that would not
        resolve on a surrogate is then no error. True unless a subclass says otherwise."""
        return True

    def check(self, cell: CellView) -> None:
        """Judge the parameters against the cell the attack will craft in (its surrogates' layers,
        the dataset's classes and training images: :meth:`Param.check_in
        <advtransfer.attacks.params.Param.check_in>`). The preflight calls it for every cell before
        any model trains; an attack with checks of its own extends it. A UserError when one fails."""
        for key, p in self.declared().items():
            p.check_in(self.name, key, self.value(key), cell, self.uses(key))

    def objective(self, y_true: torch.Tensor | None = None) -> Objective:
        """This attack's :class:`Objective` for one call: its loss, ensemble mode and
        targeting, with the batch's true labels ``y_true`` (N)."""
        return Objective(self.loss, self.ensemble, self.targeted, y_true)

    def run(self, surrogate: SurrogateSet | nn.Module | Sequence[nn.Module], x: torch.Tensor,
            y: torch.Tensor, index: torch.Tensor | None = None, y_true: torch.Tensor | None = None) -> Perturbed:
        """Craft adversarial examples; the one public call path of every per-image use.

        x: N×C×H×W in [0,1]; y: labels N (the *target* labels when ``targeted``); index: dataset
        indices N (seeds the per-image randomness; defaults to 0..N-1); y_true: the true labels
        when ``targeted`` (needed by loss potrip). Returns a :class:`Perturbed`: x_adv, same shape,
        with ‖x_adv − x‖ ≤ ε per sample and x_adv in [0,1]; the gradient evaluations spent per
        image; what a learning kind learned (``extras``). The surrogate set is not changed.
        """
        S = surrogate if isinstance(surrogate, SurrogateSet) else SurrogateSet(surrogate)
        call = S.bind(self.objective(y_true if self.targeted else y))
        if index is None:
            index = torch.arange(len(x))
        x = x.detach()
        out = self.perturb(call, x, y, index)
        if not isinstance(out, Perturbed):
            out = Perturbed(out, call.grad_evals)
        from .ops import project

        return Perturbed(project(out.x_adv.detach(), x, self.eps, self.norm), out.grad_evals, out.extras)

    def __call__(self, surrogate: SurrogateSet | nn.Module | Sequence[nn.Module], x: torch.Tensor,
                 y: torch.Tensor, index: torch.Tensor | None = None, y_true: torch.Tensor | None = None) -> torch.Tensor:
        """x_adv of :meth:`run` (N×C×H×W in [0,1], ‖x_adv − x‖ ≤ ε per sample)."""
        return self.run(surrogate, x, y, index, y_true).x_adv

    def craft(self, S: SurrogateSet, ctx: CraftContext) -> Crafted:
        """Craft the cell's examples: the one protocol every kind implements.

        The per-image default runs :meth:`run` on the context's images in batches of
        ``ctx.batch_size``; targeted attacks aim at :func:`make_targets` (seeded by image).
        """
        t0 = time.perf_counter()
        x_all, y_all, index = ctx.x, ctx.y, ctx.index
        target = self.choose_targets(S, ctx) if self.targeted else None
        if self.targeted and _is_int(self.target):  # one fixed target: its own class's images leave
            keep = y_all != self.target
            x_all, y_all, index, target = x_all[keep], y_all[keep], index[keep], target[keep]
        goal = target if target is not None else y_all
        evals = 0
        from ..core.accel import BatchPlan, autocast

        def chunk(s: int, e: int) -> torch.Tensor:
            nonlocal evals
            xb = x_all[s:e].to(ctx.device)
            with autocast(ctx.precision, ctx.device):
                res = self.run(S, xb, goal[s:e].to(ctx.device), index[s:e], y_true=y_all[s:e].to(ctx.device))
            evals = max(evals, res.grad_evals)
            out = res.x_adv.cpu()
            if ctx.progress is not None:
                ctx.progress(len(xb))
            return out

        plan = BatchPlan(ctx.batch_size, ctx.log, "crafting batch",
                         fixed=f"attack {self.name!r} draws its randomness per crafting batch, so a smaller batch "
                               "would change its examples; lower the grid's batch_size (or use rng: image)"
                         if self.batch_dependent else None)
        outs = plan.run(chunk, len(x_all))
        if ctx.progress is not None and len(x_all) < len(ctx.x):
            ctx.progress(len(ctx.x) - len(x_all))
        return Crafted(torch.cat(outs).float(), index, target, int(evals), time.perf_counter() - t0,
                       fields={"batch_used": plan.size, "precision": ctx.precision})

    def choose_targets(self, S: SurrogateSet, ctx: CraftContext) -> torch.Tensor:
        """Target labels (N) for a targeted attack: ``random`` (≠ y, seeded per image), the
        surrogate set's ``least_likely`` class other than y on the clean image (forward passes,
        not counted as gradient evaluations), the ``next`` class ((y + 1) mod classes), or one fixed class (images of that class are left out)."""
        if self.target == "random":
            return make_targets(ctx.y, ctx.index, self.seed)
        if self.target == "next":  # the class count from the surrogates' logits (one forward pass)
            return next_targets(ctx.y, int(S.mean_logits(ctx.x[:1].to(ctx.device)).shape[1]))
        if self.target == "least_likely":
            out = []
            for s in range(0, len(ctx.x), ctx.batch_size):
                z = S.mean_logits(ctx.x[s:s + ctx.batch_size].to(ctx.device)).cpu()
                z[torch.arange(len(z)), ctx.y[s:s + ctx.batch_size]] = float("inf")  # never the true class
                out.append(z.argmin(1))
            return torch.cat(out)
        return torch.full_like(ctx.y, int(self.target))

    def rngs(self, index: torch.Tensor, stream: str = "") -> list[torch.Generator]:
        """One generator per image, seeded from (attack seed, dataset index, stream)."""
        gens = []
        for i in index.tolist():
            h = hashlib.blake2b(f"{self.seed}:{i}:{stream}".encode(), digest_size=8).digest()
            gens.append(torch.Generator().manual_seed(int.from_bytes(h, "little") & ((1 << 63) - 1)))
        return gens


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def take_extra(attack: Attack, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The attack's defaults overridden by ``kwargs``, each value judged by its declared
    :class:`~.params.Param` (type and range); unknown names (with close matches) and values it
    does not take are a UserError."""
    from ..core.registry import suggest

    declared = attack.parameters
    unknown = sorted(set(kwargs) - set(declared))
    if unknown:
        known = sorted(declared) + ["eps", "norm", "steps", "alpha", "targeted", "seed", "ensemble"]
        raise UserError(f"attack {attack.name!r}: " + suggest(str(unknown[0]), known, "parameter"))
    return {**{k: p.default for k, p in declared.items()},
            **{k: declared[k].check(attack.name, k, v) for k, v in kwargs.items()}}


ATTACKS: Registry[type[Attack]] = Registry("attack")


def register_attack(name: str, *, kind: str, version: int, aliases: str | tuple[str, ...] = ()):
    """Class decorator: register an :class:`Attack` subclass under ``name`` with its ``kind``
    (one of :data:`ATTACK_KINDS`) and ``version`` (an integer ≥ 1; bump it when the output changes)."""
    if kind not in ATTACK_KINDS:
        raise ValueError(f"attack {name!r}: kind {kind!r} is not one of {ATTACK_KINDS}")
    if not isinstance(version, int) or version < 1:
        raise ValueError(f"attack {name!r}: version must be an integer >= 1")

    def deco(cls: type[Attack]) -> type[Attack]:
        cls.name, cls.kind, cls.version = name, kind, version
        ATTACKS.add(name, cls, aliases=aliases, kind=kind, version=version)
        return cls

    return deco


def create_attack(name: str, **params: Any) -> Attack:
    """Instantiate a registered attack: ``create_attack('mifgsm', eps='8/255', steps=10)``."""
    return ATTACKS.get(name)(**params)
