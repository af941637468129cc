"""Grid files (``grids/*.yaml``) → validated :class:`GridSpec` → list of :class:`Cell`.

A cell is one crafting job: (surrogate set, attack with its parameters, ε, seed) on a dataset
subset. Its id hashes the canonical config, including the sha256 of the surrogate weights, so a
retrained surrogate gives new cells and cached adversarial examples are never reused wrongly.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError
from .registry import suggest
from .resources import grids_dir
from .utils import eps_to_str, parse_fraction, short_hash

MATCH_KINDS = ("step", "evals")
GRID_KEYS = {"craft_dataset", "precision", "compile", "executor", "workers", "matched", "replicates", "reference", "name", "description", "dataset", "split", "n", "start", "size", "batch_size", "seeds",
             "norm", "eps", "targeted", "budget", "defaults", "attacks", "surrogates", "victims"}


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

    def runs(self, attack: "AttackEntry") -> bool:
        return not self.only_attacks or attack.label in self.only_attacks or attack.attack in self.only_attacks

    @property
    def name(self) -> str:
        return self.label or "+".join(self.models)


#: attack parameters that name a zoo model the attack uses (not a surrogate, not a victim)
AUX_MODEL_KEYS = ("clip",)


@dataclass(frozen=True)
class AttackEntry:
    """An attack of the grid: its label, registry name and parameters; a matched baseline also
    says which label it serves (``baseline_for``) and how it is matched (``match``: step, evals)."""

    label: str
    attack: str
    params: dict
    match: str = "none"
    baseline_for: str = ""


@dataclass
class GridSpec:
    name: str
    dataset: str
    split: str
    n: int
    start: int
    size: str
    batch_size: int
    seeds: list[int]
    norm: str
    eps: list[float]
    targeted: bool
    budget: str
    attacks: list[AttackEntry]
    surrogates: list[SurrogateEntry]
    victims: list[str]
    source: str = ""
    raw: dict = field(default_factory=dict)
    matched: tuple[str, ...] = ()   # add matched baselines: "step" (same α and steps), "evals" (same α and gradient evaluations)
    executor: str = "serial"         # who runs the cells (advtransfer.executors); never enters a cell id
    workers: int | None = None       # local executor: worker processes
    craft_dataset: str = ""          # training images of universal attacks, if not the dataset's (e.g. unshifted)
    precision: str = "fp32"          # autocast of the crafting passes (advtransfer.accel); enters the cell id if not fp32
    compile: str = "off"             # torch.compile of single surrogates where timed faster (advtransfer.accel); no cell id

    def model_names(self) -> list[str]:
        names = [m for s in self.surrogates for m in s.models] + list(self.victims) + self.aux_models()
        return list(dict.fromkeys(names))

    def aux_models(self) -> list[str]:
        """Zoo models the attacks use besides the surrogates (a generator's CLIP model: parameter
        ``clip``); their weight checksums enter the cells' ids."""
        return list(dict.fromkeys(str(a.params[k]) for a in self.attacks for k in AUX_MODEL_KEYS if a.params.get(k)))


@dataclass(frozen=True)
class Cell:
    """One crafting job. ``config`` is the canonical JSON-able description hashed into ``cell_id``."""

    cell_id: str
    surrogate: SurrogateEntry
    attack: AttackEntry
    eps: float
    seed: int
    config: dict


def resolve_grid_path(grid: str) -> Path:
    """A grid by path, or by name under ``grids/`` (``ci`` → grids/ci.yaml)."""
    p = Path(grid)
    if p.is_file():
        return p
    for cand in (grids_dir() / f"{grid}.yaml", grids_dir() / grid, Path("grids") / f"{grid}.yaml"):
        if cand.is_file():
            return cand
    known = sorted(q.stem for q in grids_dir().glob("*.yaml"))
    raise UserError(suggest(str(grid), known, "grid") + "; give a path to a grid YAML file or a name under grids/")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_scalars(raw: dict, src: str) -> None:
    """Types and ranges of the grid's scalar keys (one UserError line each)."""
    for key, what in (("name", "a string"), ("description", "a string"), ("dataset", "a dataset name"),
                      ("craft_dataset", "a dataset name"),
                      ("reference", "a surrogate name")):
        if key in raw:
            _need(isinstance(raw[key], str), src, f"{key} must be {what}, got {raw[key]!r}")
    if "split" in raw:  # which splits exist is the dataset's business (cifar10: train/test; image folders: any)
        _need(isinstance(raw["split"], str) and raw["split"], src, f"split must be a split name, got {raw['split']!r}")
    for key, low in (("n", 1), ("batch_size", 1), ("start", 0)):
        if key in raw:
            _need(_is_int(raw[key]) and raw[key] >= low, src, f"{key} must be an integer >= {low}, got {raw[key]!r}")
    _need(isinstance(raw.get("targeted", False), bool), src, f"targeted must be true or false, got {raw.get('targeted')!r}")
    seeds = raw.get("seeds", [0])
    seeds = seeds if isinstance(seeds, list) else [seeds]
    _need(bool(seeds) and all(_is_int(s) for s in seeds), src, f"seeds must be a list of integers, got {raw.get('seeds')!r}")
    _need(len(set(seeds)) == len(seeds), src, f"seeds repeat a value: {seeds}")


def _check_weights(w: Any, n_models: int, src: str, who: Any) -> None:
    import math

    ok = isinstance(w, list) and len(w) == n_models and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 for v in w)
    _need(ok and sum(w) > 0, src, f"surrogate set {who}: weights must be a list of {n_models} non-negative "
                                  f"numbers, not all zero; got {w!r}")


def _num_classes(dataset: str) -> int:
    """Classes of a dataset the harness knows (10 for CIFAR-10; 1000 for ImageNet-style sets)."""
    return 10 if str(dataset).startswith("cifar10") else 1000


def _need(cond: bool, source: str, msg: str) -> None:
    if not cond:
        raise UserError(f"{source}: {msg}")


def load_grid(grid: str, attack: str | None = None) -> GridSpec:
    """Read and validate a grid file. ``attack`` (comma-separated) keeps only those attacks; a
    registry attack the grid does not list runs with the grid's defaults."""
    from .attacks import ATTACKS

    path = resolve_grid_path(grid)
    src = str(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise UserError(f"{src}: not valid YAML ({str(exc).splitlines()[0]})") from None
    _need(isinstance(raw, dict), src, "a grid file must be a mapping of keys (name, eps, attacks, surrogates, victims, ...)")
    unknown = sorted((str(k) for k in set(raw) - GRID_KEYS if not str(k).startswith("x-")), key=str)
    if unknown:
        raise UserError(f"{src}: " + suggest(unknown[0], sorted(GRID_KEYS), "grid key")
                        + " (keys starting with x- are free for YAML anchors)")
    for key in ("eps", "attacks", "surrogates", "victims"):
        _need(key in raw, src, f"missing required key {key!r}")
    _check_scalars(raw, src)

    eps_raw = raw["eps"] if isinstance(raw["eps"], list) else [raw["eps"]]
    _need(bool(eps_raw), src, "eps must list at least one radius, like [8/255]")
    eps = [parse_fraction(e, "eps") for e in eps_raw]
    norm = raw.get("norm", "linf")
    _need(norm in ("linf", "l2"), src, f"norm must be linf or l2, not {norm!r}")
    for e, r in zip(eps, eps_raw):
        _need(e > 0 and (e <= 1 or norm == "l2"), src, f"eps {r} is outside (0, 1]; give it like 8/255")

    defaults = raw.get("defaults") or {}
    _need(isinstance(defaults, dict), src, "defaults must be a mapping of attack parameters")
    attacks_raw = raw["attacks"]
    _need(isinstance(attacks_raw, dict) and attacks_raw, src, "attacks must be a non-empty mapping label -> parameters")
    entries: dict[str, AttackEntry] = {}
    for label, params in attacks_raw.items():
        _need(params is None or isinstance(params, dict), src,
              f"parameters of attack {label!r} must be a mapping like {{steps: 10}}, got {params!r}")
        params = dict(params or {})
        name = ATTACKS.canonical(str(params.pop("attack", label)))  # an alias (bim) resolves to its entry
        _check_grid_level_params({**defaults, **params}, src, str(label))
        merged = {**defaults, **params}
        if merged.get("target") == "all":  # one entry per target class (each leaves its own class out)
            n_cls = _num_classes(raw.get("dataset", "cifar10"))
            _need(merged.get("targeted") is True, src, f"attack {label!r}: target: all needs targeted: true")
            _need(n_cls <= 20, src, f"attack {label!r}: target: all would make {n_cls} entries; name one class "
                                    f"(target: 3) or use target: random")
            for c in range(n_cls):
                entries[f"{label}@t{c}"] = AttackEntry(f"{label}@t{c}", name, {**merged, "target": c})
            continue
        entries[str(label)] = AttackEntry(str(label), name, merged)
    if attack:
        chosen = []
        for a in [s.strip() for s in attack.split(",") if s.strip()]:
            # a name selects the entry with that label and every entry running that attack
            # (e.g. sgd_uap and a targeted sgd_uap_targeted: {attack: sgd_uap, targeted: true})
            canon = ATTACKS.canonical(a) if a in ATTACKS else None
            same = [e for e in entries.values() if e.label == a or e.attack in (a, canon)]
            if same:
                chosen.extend(e for e in same if e not in chosen)
            else:
                chosen.append(AttackEntry(a, ATTACKS.canonical(a), dict(defaults)))  # unknown names raise with close matches
        attack_list = chosen
    else:
        attack_list = list(entries.values())

    surrogates = []
    _need(isinstance(raw["surrogates"], list) and raw["surrogates"], src, "surrogates must be a non-empty list")
    grid_reps = raw.get("replicates", 1)
    _need(isinstance(grid_reps, int) and not isinstance(grid_reps, bool) and grid_reps >= 1, src,
          f"replicates must be a positive integer, got {grid_reps!r}")
    for s in raw["surrogates"]:
        reps = grid_reps
        if isinstance(s, dict) and "replicates" in s:
            s = dict(s)
            reps = s.pop("replicates")
            _need(isinstance(reps, int) and not isinstance(reps, bool) and reps >= 1, src,
                  f"surrogate set {s.get('name', s.get('models'))}: replicates must be a positive integer, got {reps!r}")
        n_before = len(surrogates)
        if isinstance(s, str):
            surrogates.append(SurrogateEntry((s,)))
        elif isinstance(s, list) and s and all(isinstance(m, str) for m in s):
            surrogates.append(SurrogateEntry(tuple(s)))
        elif isinstance(s, dict) and isinstance(s.get("models"), list) and s["models"]:
            _need(all(isinstance(m, str) for m in s["models"]), src,
                  f"surrogate set {s.get('name', s['models'])}: models must be model names")
            w = s.get("weights")
            if w is not None:
                _check_weights(w, len(s["models"]), src, s.get("name", s["models"]))
            from .models.collections import check_options

            only = s.get("attacks") or []
            _need(isinstance(only, list) and all(isinstance(a, str) for a in only), src,
                  f"surrogate set {s.get('name', s['models'])}: attacks must be a list of attack names")
            for a in only:
                if a not in attacks_raw:
                    ATTACKS.get(a)
            opts = {k: v for k, v in s.items() if k not in ("models", "weights", "name", "attacks")}
            check_options(opts, f"{src}: surrogate set {s.get('name', s['models'])}: ")
            surrogates.append(SurrogateEntry(tuple(s["models"]), tuple(float(v) for v in w) if w else None,
                                             str(s.get("name", "")), tuple(sorted(opts.items())), tuple(only)))
        else:
            raise UserError(f"{src}: a surrogate must be a model name, a list of names, or "
                            f"{{models: [...], weights: [...], name: ...}}; got {s!r}")
        if reps > 1:  # independently seeded replicates of every member: <model>@r<k>, rows share surrogate_base
            from .models.catalogue import replicate_name

            entry = surrogates.pop()
            assert len(surrogates) == n_before
            for k in range(reps):
                models = tuple(replicate_name(m, k) for m in entry.models)
                surrogates.append(replace(entry, models=models, label=f"{entry.name}@r{k}" if k else entry.name,
                                          base=entry.name, replicate=k))
    victims = raw["victims"]
    _need(isinstance(victims, list) and victims and all(isinstance(v, str) for v in victims), src,
          "victims must be a non-empty list of model names")

    n = raw.get("n", 1000)
    seeds = raw.get("seeds", [0])
    seeds = seeds if isinstance(seeds, list) else [seeds]
    budget = raw.get("budget", "steps")
    _need(budget in ("steps", "grad_evals"), src, f"budget must be 'steps' or 'grad_evals', not {budget!r}")
    ref = raw.get("reference")
    _need(ref is None or (isinstance(ref, str) and ref in {e.base or e.name for e in surrogates}), src,
          f"reference must name one of the grid's surrogates (the one every other surrogate is compared with), got {ref!r}")
    matched = raw.get("matched") or []
    matched = [matched] if isinstance(matched, str) else matched
    _need(isinstance(matched, list) and all(m in MATCH_KINDS for m in matched), src,
          f"matched must be a list of {', '.join(MATCH_KINDS)} (baselines matched in step size and steps, "
          f"or in step size and gradient evaluations), got {raw.get('matched')!r}")
    executor, workers = raw.get("executor", "serial"), raw.get("workers")
    from .config import EXECUTORS

    _need(executor in EXECUTORS, src, f"executor must be one of {', '.join(EXECUTORS)}, not {executor!r}")
    _need(workers is None or (_is_int(workers) and workers >= 1), src,
          f"workers must be a whole number >= 1, got {workers!r}")
    from .accel import COMPILE_MODES, PRECISIONS

    precision, compile_mode = raw.get("precision", "fp32"), raw.get("compile", "off")
    _need(precision in PRECISIONS, src, f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    _need(compile_mode in COMPILE_MODES, src, f"compile must be one of {', '.join(COMPILE_MODES)}, not {compile_mode!r}")
    size = raw.get("size", "cpu")
    from .config import SIZES

    _need(size in SIZES, src, f"size must be one of {', '.join(SIZES)}, not {size!r}")
    spec = GridSpec(
        name=str(raw.get("name", path.stem)), dataset=str(raw.get("dataset", "cifar10")),
        split=str(raw.get("split", "test")), n=n, start=int(raw.get("start", 0)), size=size,
        batch_size=int(raw.get("batch_size", 250)), seeds=seeds, norm=norm, eps=eps,
        targeted=bool(raw.get("targeted", False)), budget=budget, attacks=attack_list,
        surrogates=surrogates, victims=list(victims), source=src, raw=copy.deepcopy(raw),
        matched=tuple(dict.fromkeys(matched)), executor=executor, workers=workers,
        craft_dataset=str(raw.get("craft_dataset", "")), precision=precision, compile=compile_mode)
    _check_models(spec)
    return spec


def _check_models(spec: GridSpec) -> None:
    from .models.zoo import get_spec, load_specs

    specs = load_specs()
    for name in spec.model_names():
        get_spec(name, specs)
    for a in spec.attacks:  # a generator's CLIP model (cond: clip, PDCL) must be a CLIP entry
        for key in AUX_MODEL_KEYS:
            if a.params.get(key):
                ms = get_spec(str(a.params[key]), specs)
                _need(ms.arch.startswith("open_clip/"), spec.source,
                      f"attack {a.label!r}: {key}: {ms.name!r} is not an open_clip model (arch {ms.arch}); name a "
                      f"CLIP entry of victims/clip.yaml such as clip_vit_b32")
    # downstream models (their own label set, advtransfer.variants) are victims only, untargeted
    downstream = {n for n in spec.model_names() if get_spec(n, specs).label_set() != "cifar10"}
    sur = sorted({m for s in spec.surrogates for m in s.models} & downstream)
    _need(not sur, spec.source, f"surrogate {sur[0] if sur else ''!r} predicts its own label set, not the dataset's; "
                                "attacks need the dataset's labels: use it as a victim only")
    targeted = spec.targeted or any(a.params.get("targeted") for a in spec.attacks)
    vic = sorted(set(spec.victims) & downstream)
    _need(not (vic and targeted), spec.source, f"victim {vic[0] if vic else ''!r} predicts its own label set, so a "
                                               "targeted attack's target class means nothing to it; leave it out of targeted grids")


#: attack parameters the grid sets for every cell: giving them per attack would be ambiguous
GRID_LEVEL_PARAMS = {"eps": "eps: [8/255] (a list of radii, one cell each)",
                     "seed": "seeds: [0, 1] (one cell per seed)"}


def _check_grid_level_params(params: dict, src: str, label: str) -> None:
    """Refuse attack parameters that belong to the grid (eps, seed) and a malformed grad_evals."""
    for key, where in GRID_LEVEL_PARAMS.items():
        _need(key not in params, src, f"attack {label!r}: {key} is set for the whole grid, not per attack; "
                                      f"give it at top level as {where}")
    if "grad_evals" in params:
        g = params["grad_evals"]
        _need(isinstance(g, int) and not isinstance(g, bool) and g >= 1, src,
              f"attack {label!r}: grad_evals must be a whole number of gradient evaluations >= 1, got {g!r}")


def resolve_attack(entry: AttackEntry, spec: GridSpec, eps: float, seed: int, n_models: int):
    """Instantiate the attack of a cell; returns the attack object.

    ``budget: grad_evals`` grids give ``grad_evals: G`` in the attack parameters; the number of
    steps is then chosen so that the attack spends at most G gradient evaluations per image.
    """
    from .attacks import ATTACKS, create_attack

    if entry.match != "none":  # a matched baseline: its parameters were resolved for this cell
        return create_attack(entry.attack, eps=eps, seed=seed, **entry.params)
    params = dict(entry.params)
    params.setdefault("norm", spec.norm)
    if not getattr(ATTACKS.get(entry.attack), "conditional", False):  # multi-target generators are targeted
        params.setdefault("targeted", spec.targeted)
    target_evals = params.pop("grad_evals", None)
    attack = create_attack(entry.attack, eps=eps, seed=seed, **_alpha_from_eps(params, eps))
    if spec.budget == "grad_evals":
        if target_evals is None:
            raise UserError(f"{spec.source}: budget grad_evals needs 'grad_evals: N' for attack {entry.label!r}")
        attack = _match_grad_evals(entry, params, eps, seed, n_models, int(target_evals))
    return attack


def _alpha_from_eps(params: dict, eps: float) -> dict:
    """``alpha_over_eps: k`` (either budget) sets the step size α = k·ε for every ε of the grid."""
    p = dict(params)
    if "alpha_over_eps" in p:
        p["alpha"] = eps * parse_fraction(p.pop("alpha_over_eps"), "alpha_over_eps")
    return p


def _match_grad_evals(entry: AttackEntry, params: dict, eps: float, seed: int, n_models: int, target: int):
    from .attacks import create_attack

    best = None
    for steps in range(1, 10_000):
        a = create_attack(entry.attack, eps=eps, seed=seed, **_alpha_from_eps({**params, "steps": steps}, eps))
        if a.grad_evals_formula(n_models) > target:
            break
        best = a
    if best is None:
        raise UserError(f"attack {entry.label!r} cannot run one step within {target} gradient evaluations")
    return best


#: the baseline every other per-image attack is matched against: MI-FGSM on the logit ensemble
BASELINE_ATTACK = "mifgsm"


def is_baseline(entry: AttackEntry) -> bool:
    """A matched baseline row, or an entry that is itself the baseline (MI-FGSM, logit ensemble)."""
    return entry.match != "none" or (entry.attack == BASELINE_ATTACK and entry.params.get("ensemble", "logit") == "logit")


def _ratio_label(alpha: float, eps: float) -> str:
    k = eps / alpha
    return f"eps/{round(k)}" if abs(k - round(k)) < 1e-6 else f"{alpha * 255:.3g}/255"


def matched_baseline(attack, match: str, n_models: int) -> tuple[str, dict]:
    """(label, parameters) of the MI-FGSM logit-ensemble baseline matched to a resolved ``attack``
    on ``n_models`` surrogates: ``step`` takes its step size α and its steps; ``evals`` its step
    size α and as many steps as fit in its gradient evaluations per image (MI-FGSM costs one per
    model and step). The label names the baseline by what defines it, so two attacks with the same
    matched baseline share one cell."""
    if match == "step":
        steps = attack.steps
    else:
        steps = max(1, attack.grad_evals_formula(n_models) // n_models)
    params = {"steps": steps, "alpha": attack.alpha, "norm": attack.norm, "targeted": attack.targeted,
              "ensemble": "logit"}
    return f"base_{match}[T={steps},a={_ratio_label(attack.alpha, attack.eps)}]", params


def expand_cells(spec: GridSpec, model_shas: dict[str, str]) -> list[Cell]:
    """All cells of the grid. ``model_shas`` maps model name → sha256 of its weights.

    With ``matched`` the grid adds, for each (surrogate set, attack, ε, seed) whose attack is a
    per-image kind and not itself the baseline, the matched MI-FGSM baselines (see
    :func:`matched_baseline`); a baseline serving several attacks is one cell whose
    ``baseline_for`` lists them."""
    from .attacks import ATTACKS
    from .attacks.base import PER_IMAGE_KINDS

    cells: dict[str, Cell] = {}

    def add(s: SurrogateEntry, a: AttackEntry, eps: float, seed: int, attack) -> None:
        config = {
            "dataset": spec.dataset, "split": spec.split, "start": spec.start, "n": spec.n,
            "size": spec.size, "surrogate": list(s.models),
            "surrogate_weights": list(s.weights) if s.weights else None,
            "surrogate_sha": [model_shas[m] for m in s.models], "label": a.label,
            "attack": a.attack, "attack_kind": attack.kind, "attack_version": attack.version,
            "attack_params": attack.params(), "seed": seed,
        }
        if s.options:
            config["surrogate_options"] = dict(s.options)
        if spec.craft_dataset and attack.kind not in PER_IMAGE_KINDS:
            config["craft_dataset"] = spec.craft_dataset
        aux = {str(v): model_shas[str(v)] for k, v in attack.params().items() if k in AUX_MODEL_KEYS and v}
        if aux:  # e.g. the CLIP model a generator is conditioned on
            config["aux_sha"] = aux
        if spec.precision != "fp32":  # mixed precision changes the examples (never an fp32 cell's id)
            config["precision"] = spec.precision
        cid = short_hash(config)
        if cid in cells:  # a shared baseline: it serves one more attack
            old = cells[cid]
            fors = old.attack.baseline_for.split(",") + [f for f in a.baseline_for.split(",") if f]
            a = replace(old.attack, baseline_for=",".join(dict.fromkeys(fors)))
        cells[cid] = Cell(cid, s, a, eps, seed, config)

    for s in spec.surrogates:
        for a in (a for a in spec.attacks if s.runs(a)):
            for eps in spec.eps:
                for seed in spec.seeds:
                    attack = resolve_attack(a, spec, eps, seed, len(s.models))
                    add(s, a, eps, seed, attack)
                    if is_baseline(a) or ATTACKS.get(a.attack).kind not in PER_IMAGE_KINDS:
                        continue
                    for match in spec.matched:
                        label, params = matched_baseline(attack, match, len(s.models))
                        b = AttackEntry(label, BASELINE_ATTACK, params, match, a.label)
                        add(s, b, eps, seed, resolve_attack(b, spec, eps, seed, len(s.models)))
    return list(cells.values())


def describe(cell: Cell) -> str:
    return f"{cell.surrogate.name} · {cell.attack.label} · {eps_to_str(cell.eps)} · seed {cell.seed}"
