"""The grid spec: a typed description of one grid, and its one :meth:`GridSpec.validate`.

A spec comes from a grid file (:func:`advtransfer.grid.load_grid`) or is built in Python; either
way :meth:`GridSpec.validate` judges every value it holds (types, ranges, names against the attack
registry and the zoo catalogue) and :meth:`GridSpec.with_overrides` applies the CLI's flags and
validates again. What needs the machine or the data (device, run folder, images, checkpoints, each
cell's attack parameters) is :func:`advtransfer.run.validate.preflight`'s, which :func:`run_grid` runs.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from ..core.errors import UserError
from .runspec import RunSpec

#: how a matched baseline is matched: same step size and steps, or same step size and gradient evaluations
MATCH_KINDS = ("step", "evals")
#: what an attack's budget counts: its steps, or its gradient evaluations per image (``grad_evals: N``)
BUDGETS = ("steps", "grad_evals")
NORMS = ("linf", "l2")
#: attack parameters that name a zoo model the attack uses (not a surrogate, not a victim)
AUX_MODEL_KEYS = ("clip",)
#: attack parameters a per-size override (``sizes:``) may not change: what the grid reads before sizes apply
SIZE_FIXED_PARAMS = ("attack", "sizes", "targeted", "target", "grad_evals", *AUX_MODEL_KEYS)
#: attack parameters the grid sets for every cell: giving them per attack would be ambiguous
GRID_LEVEL_PARAMS = {"eps": "eps: [8/255] (a list of radii, one cell each)",
                     "seed": "seeds: [0, 1] (one cell per seed)"}
#: the CLI flag that sets each field :meth:`GridSpec.with_overrides` takes (messages name it)
OVERRIDE_FLAGS = {"attack": "--attack", "size": "--size", "n": "-n", "precision": "--precision",
                  "compile": "--compile", "executor": "--executor", "workers": "--workers", "plugins": "--plugin"}


@dataclass(frozen=True)
class SurrogateEntry:
    """A surrogate set: member model names, optional weights, a display name, and options for
    members that are collections (``per_step``, ``scale``, ... see models/collections.py)."""

    models: tuple[str, ...]
    weights: tuple[float, ...] | None = None
    label: str = ""
    options: tuple[tuple[str, Any], ...] = ()
    only_attacks: tuple[str, ...] = ()  # if set, this row runs only these attack labels/names
    base: str = ""          # for a replicate: the name of the entry it replicates (rows share it)
    replicate: int = 0      # which independently seeded replicate of the models
    size_attacks: tuple[tuple[str, tuple[str, ...]], ...] = ()  # ``sizes: {<size>: {attacks: [...]}}``: the list at that zoo size

    def runs(self, attack: "AttackEntry", size: str | None = None) -> bool:
        """Whether this row runs ``attack`` at zoo ``size``: every attack unless ``only_attacks`` (or,
        at a size ``size_attacks`` names, that size's list) names some."""
        only = dict(self.size_attacks).get(size, self.only_attacks) if size is not None else self.only_attacks
        return not only or attack.label in only or attack.attack in only

    @property
    def name(self) -> str:
        return self.label or "+".join(self.models)


@dataclass(frozen=True)
class AttackEntry:
    """An attack of the grid: its label, registry name and parameters; a matched baseline also
    says which label it serves (``baseline_for``) and how it is matched (``match``: step, evals)."""

    label: str
    attack: str
    params: dict
    match: str = "none"
    baseline_for: str = ""


@dataclass(frozen=True)
class GridSpec:
    """One grid. ε in pixel space ([0,1] images; 8/255 ≈ 0.0314); ``n`` test images from ``start``.

    Fields hold what was given; :meth:`validate` says whether it is usable. ``origin`` maps a field
    to the CLI flag that set it (messages name the flag instead of the file's key). The fields that
    are plain values take their defaults from :class:`~advtransfer.grid.runspec.RunSpec` (the view
    the run manifest records, :meth:`run_spec`; it imports no model code, so the report can read it)."""

    name: str                        # the run's name (default: the grid file's stem; the run folder is results/<name>/)
    size: str                        # zoo size: ci, cpu, converged (the shipped zoo) or full (default: $ADVTRANSFER_SIZE or converged)
    eps: list[float]                 # radii in pixel space, one cell each: [4/255, 8/255]
    attacks: list[AttackEntry]       # label -> {attack: registry name, parameters}; {} takes the defaults
    surrogates: list[SurrogateEntry]  # model names, or lists of them (an ensemble row), or {models, weights, label}
    victims: list[str]               # model names every cell is evaluated on
    dataset: str = RunSpec.dataset   # cifar10 (or imagenet, a folder with val/)
    split: str = RunSpec.split       # the evaluation images' split
    n: int = RunSpec.n               # evaluation images, the first n of the split from start
    start: int = RunSpec.start       # first evaluation image's index
    batch_size: int = RunSpec.batch_size  # crafting batch (victims evaluate in batches of twice this)
    seeds: list[int] = field(default_factory=lambda: list(RunSpec.seeds))  # one cell per seed (the attack's randomness)
    norm: str = RunSpec.norm         # linf or l2
    targeted: bool = RunSpec.targeted  # every attack targeted (per attack: targeted: true)
    budget: str = RunSpec.budget     # what steps count: steps, or grad_evals (per image)
    source: str = ""
    raw: dict = field(default_factory=dict)
    matched: tuple[str, ...] = RunSpec.matched  # add matched baselines: "step" (same α and steps), "evals" (same α and gradient evaluations)
    executor: str = RunSpec.executor  # who runs the cells (advtransfer.run.executors); never enters a cell id
    workers: int | None = RunSpec.workers  # local executor: worker processes
    craft_dataset: str = RunSpec.craft_dataset  # training images of universal attacks, if not the dataset's (e.g. unshifted)
    precision: str = RunSpec.precision  # autocast of the crafting passes (advtransfer.core.accel); enters the cell id if not fp32
    compile: str = RunSpec.compile   # torch.compile of single surrogates where timed faster (advtransfer.core.accel); no cell id
    reference: str | None = RunSpec.reference  # the surrogate `compare` and the report compare every other surrogate with
    description: str = RunSpec.description  # free text about the grid (its purpose), kept in the run manifest
    defaults: dict = field(default_factory=dict)  # attack parameters of every entry (and of --attack NAME not listed)
    plugins: tuple[str, ...] = RunSpec.plugins  # the user's code and catalogues (advtransfer.plugins); their sha256 enters cell ids
    origin: dict = field(default_factory=dict, compare=False, repr=False)

    #: fields that are the run's bookkeeping, not grid-file keys
    INTERNAL = ("source", "raw", "origin")

    @classmethod
    def file_keys(cls) -> list[str]:
        """The keys a grid file may hold: every field but the bookkeeping ones, in field order (the
        loader adds ``replicates``, which expands the surrogate rows)."""
        from dataclasses import fields

        return [f.name for f in fields(cls) if f.name not in cls.INTERNAL]

    @classmethod
    def field_default(cls, name: str) -> Any:
        """The default of field ``name`` (a fresh copy for a list or mapping)."""
        from dataclasses import MISSING, fields

        f = {f.name: f for f in fields(cls)}[name]
        if f.default is not MISSING:
            return f.default
        if f.default_factory is not MISSING:  # type: ignore[misc]
            return f.default_factory()  # type: ignore[misc]
        raise KeyError(f"grid field {name!r} has no default")

    def run_spec(self) -> RunSpec:
        """The plain values of this spec (every :class:`RunSpec` field, as this spec holds it: after
        the CLI's flags): what the run manifest records under ``spec`` and what gives the run's
        evaluation images (:meth:`RunSpec.eval_images`)."""
        return RunSpec.from_values({name: getattr(self, name) for name in RunSpec.field_names()})

    def model_names(self) -> list[str]:
        names = [m for s in self.surrogates for m in s.models] + list(self.victims) + self.aux_models()
        return list(dict.fromkeys(names))

    def aux_models(self) -> list[str]:
        """Zoo models the attacks use besides the surrogates (a generator's CLIP model: parameter
        ``clip``); their weight checksums enter the cells' ids."""
        return list(dict.fromkeys(str(a.params[k]) for a in self.attacks for k in AUX_MODEL_KEYS if a.params.get(k)))

    # --- checks -------------------------------------------------------------------------------
    def _where(self, key: str) -> str:
        """How a message names ``key``: the CLI flag that set it, else the file and the key."""
        if key in self.origin:
            return self.origin[key]
        return f"{self.source}: {key}" if self.source else key

    def _need(self, cond: Any, msg: str) -> None:
        if not cond:
            raise UserError(f"{self.source}: {msg}" if self.source else msg)

    def _one_of(self, key: str, choices: Sequence[str]) -> None:
        value = getattr(self, key)
        if isinstance(value, str) and value in choices:
            return
        close = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.5) if isinstance(value, str) else []
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UserError(f"{self._where(key)} must be one of {', '.join(choices)}, not {value!r}{hint}")

    def _whole(self, key: str, low: int, what: str = "an integer") -> None:
        value = getattr(self, key)
        if not (_is_int(value) and value >= low):
            raise UserError(f"{self._where(key)} must be {what} >= {low}, got {value!r}")

    def validate(self) -> "GridSpec":
        """Check every value of the spec; the first bad one raises a one-line UserError naming
        the key (or the flag that set it). Returns the spec, so calls chain."""
        self._check_plugins()  # first: they register names the other checks look up
        self._check_scalars()
        self._check_eps()
        self._check_attacks()
        self._check_surrogates()
        self._check_run_options()
        _check_models(self)
        return self

    def _check_plugins(self) -> None:
        """The plugins are files or module names that load (:func:`advtransfer.plugins.load_plugins`:
        idempotent, so a spec checked twice loads them once)."""
        from ..plugins import load_plugins

        plugins = self.plugins
        self._need(isinstance(plugins, (list, tuple)) and all(isinstance(p, str) for p in plugins),
                   f"plugins must be a list of Python files, module names or catalogue files, got {plugins!r}")
        load_plugins(plugins, where=self.source)

    def _check_scalars(self) -> None:
        for key, what in (("name", "a string"), ("description", "a string"), ("dataset", "a dataset name"),
                          ("craft_dataset", "a dataset name")):
            self._need(isinstance(getattr(self, key), str), f"{key} must be {what}, got {getattr(self, key)!r}")
        # which splits exist is the dataset's business (cifar10: train/test; image folders: any)
        self._need(isinstance(self.split, str) and self.split, f"split must be a split name, got {self.split!r}")
        self._whole("n", 1)
        self._whole("batch_size", 1)
        self._whole("start", 0)
        self._need(isinstance(self.targeted, bool), f"targeted must be true or false, got {self.targeted!r}")
        seeds = self.seeds
        self._need(isinstance(seeds, (list, tuple)) and seeds and all(_is_int(s) for s in seeds),
                   f"seeds must be a list of integers, got {seeds!r}")
        self._need(len(set(seeds)) == len(seeds), f"seeds repeat a value: {list(seeds)}")

    def _check_eps(self) -> None:
        self._need(self.norm in NORMS, f"norm must be linf or l2, not {self.norm!r}")
        self._need(isinstance(self.eps, (list, tuple)) and self.eps, "eps must list at least one radius, like [8/255]")
        for e in self.eps:
            self._need(isinstance(e, (int, float)) and not isinstance(e, bool), f"eps {e!r} is not a number like 8/255")
            self._need(e > 0 and (e <= 1 or self.norm == "l2"), f"eps {e:g} is outside (0, 1]; give it like 8/255")

    def _check_attacks(self) -> None:
        self._need(isinstance(self.attacks, (list, tuple)) and self.attacks,
                   "attacks must be a non-empty mapping label -> parameters")
        self._one_of("budget", BUDGETS)
        for a in self.attacks:
            for key, where in GRID_LEVEL_PARAMS.items():
                self._need(key not in a.params, f"attack {a.label!r}: {key} is set for the whole grid, not per "
                                                f"attack; give it at top level as {where}")
            self._check_size_params(a)
            g = a.params.get("grad_evals")
            self._need(g is None or (_is_int(g) and g >= 1),
                       f"attack {a.label!r}: grad_evals must be a whole number of gradient evaluations >= 1, got {g!r}")
            self._need(self.budget != "grad_evals" or a.match != "none" or g is not None,
                       f"budget grad_evals needs 'grad_evals: N' for attack {a.label!r}")
        matched = self.matched
        self._need(isinstance(matched, (list, tuple)) and all(isinstance(m, str) and m in MATCH_KINDS for m in matched),
                   f"matched must be a list of {', '.join(MATCH_KINDS)} (baselines matched in step size and steps, "
                   f"or in step size and gradient evaluations), got {matched!r}")

    def _check_size_params(self, a: AttackEntry) -> None:
        """``sizes: {converged: {gammas: [...]}}`` in an attack's parameters: values that replace the
        attack's for one zoo size (a path searched on that size's surrogate)."""
        from ..core.config import SIZES

        by_size = a.params.get("sizes")
        if by_size is None:
            return
        self._need(isinstance(by_size, dict) and by_size and all(isinstance(v, dict) for v in by_size.values()),
                   f"attack {a.label!r}: sizes must map a zoo size to parameters, like "
                   f"{{converged: {{steps: 20}}}}; got {by_size!r}")
        for size, over in by_size.items():
            self._need(size in SIZES, f"attack {a.label!r}: sizes names {size!r}, not a zoo size ({', '.join(SIZES)})")
            fixed = sorted(k for k in over if k in SIZE_FIXED_PARAMS or k in GRID_LEVEL_PARAMS)
            self._need(not fixed, f"attack {a.label!r}: sizes.{size} may not set {', '.join(fixed)} (the same "
                                  "for every zoo size); give it with the attack's other parameters")

    def attack_params(self, a: AttackEntry) -> dict:
        """``a``'s parameters at this grid's zoo size: its ``sizes.<size>`` values applied, ``sizes`` gone."""
        params = dict(a.params)
        over = (params.pop("sizes", None) or {}).get(self.size) or {}
        return {**params, **over}

    def _check_surrogates(self) -> None:
        from ..models.collections import check_options

        self._need(isinstance(self.surrogates, (list, tuple)) and self.surrogates, "surrogates must be a non-empty list")
        for s in self.surrogates:
            who = s.label or list(s.models)
            if s.weights is not None:
                _check_weights(s.weights, len(s.models), self.source, who)
            check_options(dict(s.options), f"{self.source}: surrogate set {who}: " if self.source else f"surrogate set {who}: ")
        victims = self.victims
        self._need(isinstance(victims, (list, tuple)) and victims and all(isinstance(v, str) for v in victims),
                   "victims must be a non-empty list of model names")
        ref = self.reference
        self._need(ref is None or (isinstance(ref, str) and ref in {e.base or e.name for e in self.surrogates}),
                   f"reference must name one of the grid's surrogates (the one every other surrogate is compared "
                   f"with), got {ref!r}")

    def _check_run_options(self) -> None:
        from ..core.accel import COMPILE_MODES, PRECISIONS
        from ..core.config import EXECUTORS, SIZES

        self._one_of("executor", EXECUTORS)
        if self.workers is not None:
            self._whole("workers", 1, "a whole number")
        self._one_of("precision", PRECISIONS)
        self._one_of("compile", COMPILE_MODES)
        self._one_of("size", SIZES)

    # --- derived specs ------------------------------------------------------------------------
    def with_overrides(self, *, attack: str | None = None, **changes: Any) -> "GridSpec":
        """The spec with the CLI's flags applied and validated again: ``attack`` (comma-separated)
        keeps only those attacks (a registry attack the grid does not list runs with the grid's
        ``defaults``); ``size``, ``n``, ``precision``, ``compile``, ``executor``, ``workers`` replace
        the grid's values. A None leaves the field as it is; messages name the flag."""
        unknown = sorted(set(changes) - set(OVERRIDE_FLAGS))
        if unknown:
            raise TypeError(f"with_overrides() takes {', '.join(OVERRIDE_FLAGS)}, not {', '.join(unknown)}")
        given = {k: v for k, v in changes.items() if v is not None}
        origin = {**self.origin, **{k: OVERRIDE_FLAGS[k] for k in given}}
        if attack:
            given["attacks"] = self._select(attack)
        return replace(self, **given, origin=origin).validate()

    def _select(self, attack: str) -> list[AttackEntry]:
        """The entries ``--attack`` names: a name selects the entry with that label and every entry
        running that attack (e.g. sgd_uap and a targeted ``{attack: sgd_uap, targeted: true}``)."""
        from ..attacks import ATTACKS

        chosen: list[AttackEntry] = []
        for a in [s.strip() for s in attack.split(",") if s.strip()]:
            canon = ATTACKS.canonical(a) if a in ATTACKS else None
            same = [e for e in self.attacks if e.label == a or e.attack in (a, canon)]
            if same:
                chosen.extend(e for e in same if e not in chosen)
            else:  # unknown names raise with close matches
                chosen.append(AttackEntry(a, ATTACKS.canonical(a), dict(self.defaults)))
        return chosen


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_weights(w: Any, n_models: int, src: str, who: Any) -> None:
    ok = isinstance(w, (list, tuple)) and len(w) == n_models and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 for v in w)
    if not (ok and sum(w) > 0):
        raise UserError(f"{src + ': ' if src else ''}surrogate set {who}: weights must be a list of {n_models} "
                        f"non-negative numbers, not all zero; got {list(w) if isinstance(w, tuple) else w!r}")


def _check_models(spec: GridSpec) -> None:
    """Every model the grid names is a zoo entry; a generator's CLIP model is a CLIP entry; models
    with their own label set (advtransfer.data.variants) are untargeted victims only."""
    from ..models.zoo import get_spec, load_specs

    specs = load_specs()
    for name in spec.model_names():
        get_spec(name, specs)
    for a in spec.attacks:  # a generator's CLIP model (cond: clip, PDCL) must be a CLIP entry
        for key in AUX_MODEL_KEYS:
            if a.params.get(key):
                ms = get_spec(str(a.params[key]), specs)
                spec._need(ms.arch.startswith("open_clip/"),
                           f"attack {a.label!r}: {key}: {ms.name!r} is not an open_clip model (arch {ms.arch}); name a "
                           f"CLIP entry of victims/clip.yaml such as clip_vit_b32")
    downstream = {n for n in spec.model_names() if get_spec(n, specs).label_set() != "cifar10"}
    sur = sorted({m for s in spec.surrogates for m in s.models} & downstream)
    spec._need(not sur, f"surrogate {sur[0] if sur else ''!r} predicts its own label set, not the dataset's; "
                        "attacks need the dataset's labels: use it as a victim only")
    targeted = spec.targeted or any(a.params.get("targeted") for a in spec.attacks)
    vic = sorted(set(spec.victims) & downstream)
    spec._need(not (vic and targeted), f"victim {vic[0] if vic else ''!r} predicts its own label set, so a targeted "
                                       "attack's target class means nothing to it; leave it out of targeted grids")
