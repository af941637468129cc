"""Grid files (``grids/*.yaml``) → :class:`GridSpec`.

The loader maps the YAML onto the spec's fields and checks only what that mapping needs: the file
is YAML and a mapping of known keys with the required ones, ε is written as a number, attack
entries are mappings, surrogate rows have one of their three shapes and ``replicates`` can expand
them. Every value is then judged by :meth:`GridSpec.validate`.
"""
from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import yaml

from ..core.config import SIZES, default_size
from ..core.errors import UserError
from ..core.registry import suggest
from ..core.resources import grids_dir
from ..core.utils import parse_fraction, short_hash
from .spec import AttackEntry, GridSpec, SurrogateEntry

#: the keys a grid file may hold: the spec's fields (:meth:`GridSpec.file_keys`) and ``replicates``
GRID_KEYS = {*GridSpec.file_keys(), "replicates"}
#: keys read as they are written, each defaulting to the spec field's default
_PLAIN_KEYS = ("dataset", "split", "n", "start", "batch_size", "norm", "targeted", "budget", "executor", "workers",
               "craft_dataset", "precision", "compile", "reference", "description")


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


def load_grid(grid: str, attack: str | None = None, sets: Sequence[str] | dict | None = None) -> GridSpec:
    """Read and validate a grid file (a path, or a name under grids/). ``attack`` (comma-separated)
    keeps only those attacks; a registry attack the grid does not list runs with the grid's
    defaults (see :meth:`GridSpec.with_overrides`). ``sets`` changes keys of the file before it is
    read (:func:`apply_sets`: ``KEY.PATH=VALUE`` strings as ``--set`` takes them, or a mapping)."""
    return read_grid(grid, sets).with_overrides(attack=attack)


def parse_sets(sets: Sequence[str]) -> dict:
    """``--set`` strings (``eps=[16/255]``, ``defaults.steps=50``, ``attacks.ti3={attack: tifgsm,
    kernel_size: 3}``) as one nested mapping; each value is read as YAML. One-line
    :class:`UserError` for a string without ``=`` or a value that is not YAML."""
    out: dict = {}
    for item in sets:
        key, eq, value = str(item).partition("=")
        path = [k for k in key.strip().split(".")]
        if not eq or not all(path):
            raise UserError(f"--set {item!r}: write KEY=VALUE with a grid key or a dotted path, e.g. "
                            f"--set eps=[16/255] or --set defaults.steps=50")
        try:
            val = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError as exc:
            raise UserError(f"--set {item!r}: the value is not YAML ({str(exc).splitlines()[0]})") from None
        node = out
        for k in path[:-1]:
            nxt = node.setdefault(k, {})
            if not isinstance(nxt, dict):
                raise UserError(f"--set {item!r}: {k!r} was set to a value above; set its keys or the whole value, not both")
            node = nxt
        node[path[-1]] = val
    return out


def apply_sets(raw: dict, sets: dict) -> dict:
    """``raw`` (a grid file's mapping) with ``sets`` merged in: mappings merge key by key (so
    ``{defaults: {steps: 50}}`` keeps the file's other defaults, ``{attacks: {x: {...}}}`` adds or
    replaces one attack), any other value replaces the file's. ``raw`` itself is not changed."""
    out = copy.deepcopy(raw)
    for k, v in sets.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = apply_sets(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def read_grid(grid: str, sets: Sequence[str] | dict | None = None) -> GridSpec:
    """The spec a grid file describes, ``sets`` applied (:func:`apply_sets`), not yet validated
    (:meth:`GridSpec.validate` judges it)."""
    path = resolve_grid_path(grid)
    src = str(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise UserError(f"{src}: not valid YAML ({str(exc).splitlines()[0]})") from None
    _need(isinstance(raw, dict), src, "a grid file must be a mapping of keys (name, eps, attacks, surrogates, victims, ...)")
    if sets:  # the run is another grid: its own name (so its own default run folder) and its record
        sets = parse_sets(sets) if not isinstance(sets, dict) else sets
        name = str(raw.get("name") or path.stem)
        raw = apply_sets(raw, sets)
        if "name" not in sets:
            raw["name"] = f"{name}@set-{short_hash(sets)[:8]}"
        raw["x-set"] = flatten_sets(sets)
    unknown = sorted((str(k) for k in set(raw) - GRID_KEYS if not str(k).startswith("x-")), key=str)
    if unknown:
        raise UserError(f"{src}: " + suggest(unknown[0], sorted(GRID_KEYS), "grid key")
                        + " (keys starting with x- are free for YAML anchors)")
    for key in ("eps", "attacks", "surrogates", "victims"):
        _need(key in raw, src, f"missing required key {key!r}")
    eps_raw = raw["eps"] if isinstance(raw["eps"], list) else [raw["eps"]]
    seeds = raw.get("seeds", GridSpec.field_default("seeds"))
    matched = raw.get("matched") or []
    matched = [matched] if isinstance(matched, str) else matched
    defaults = raw.get("defaults") or {}
    _need(isinstance(defaults, dict), src, "defaults must be a mapping of attack parameters")
    victims = raw["victims"]
    plugins = _plugins(raw, path, src)  # before the attack entries: they may name a plugin's attacks
    plain = {k: raw[k] for k in _PLAIN_KEYS if k in raw}  # the others take the spec's defaults
    return GridSpec(
        name=raw.get("name", path.stem), size=raw.get("size", default_size()), **plain,
        seeds=seeds if isinstance(seeds, list) else [seeds], eps=[parse_fraction(e, "eps") for e in eps_raw],
        attacks=_attack_entries(raw, defaults, src), surrogates=_surrogate_entries(raw, src),
        victims=list(victims) if isinstance(victims, list) else victims, source=src, raw=copy.deepcopy(raw),
        matched=tuple(matched) if isinstance(matched, list) else matched, defaults=defaults, plugins=plugins)


def _plugins(raw: dict, path: Path, src: str) -> tuple[str, ...]:
    """The grid's ``plugins`` (files relative to the grid file, or module names), loaded now, as
    the absolute references every process of the run loads (advtransfer.plugins)."""
    from ..plugins import load_plugins, resolve_ref

    refs = raw.get("plugins") or []
    refs = [refs] if isinstance(refs, str) else refs
    _need(isinstance(refs, list), src, f"plugins must be a list of Python files, module names or catalogue files "
                                       f"(like [my_attacks.py, my_models.yaml]), got {refs!r}")
    resolved = tuple(resolve_ref(r, path.parent, src) for r in refs)
    load_plugins(resolved, where=src)
    return resolved


def flatten_sets(sets: dict, prefix: str = "") -> list[str]:
    """``sets`` (:func:`parse_sets`'s nested mapping) back as ``KEY.PATH=VALUE`` strings, as
    ``--set`` takes them (the run's record, the claims' regime commands)."""
    out = []
    for k, v in sets.items():
        if isinstance(v, dict) and v:
            out += flatten_sets(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}={yaml.safe_dump(v, default_flow_style=True, width=10_000).strip().removesuffix('...').strip()}")
    return out


def _need(cond: bool, source: str, msg: str) -> None:
    if not cond:
        raise UserError(f"{source}: {msg}")


def _num_classes(dataset: Any) -> int:
    """Classes of a dataset the harness knows (10 for CIFAR-10; 1000 for ImageNet-style sets)."""
    return 10 if str(dataset).startswith("cifar10") else 1000


def _attack_entries(raw: dict, defaults: dict, src: str) -> list[AttackEntry]:
    """One entry per label (``attack: name`` when the label differs), the grid's ``defaults``
    merged in; ``target: all`` makes one entry per target class (each leaves its own class out)."""
    from ..attacks import ATTACKS

    attacks_raw = raw["attacks"]
    _need(isinstance(attacks_raw, dict), src, "attacks must be a non-empty mapping label -> parameters")
    entries: dict[str, AttackEntry] = {}
    for label, params in attacks_raw.items():
        _need(params is None or isinstance(params, dict), src,
              f"parameters of attack {label!r} must be a mapping like {{steps: 10}}, got {params!r}")
        params = dict(params or {})
        name = ATTACKS.canonical(str(params.pop("attack", label)))  # an alias (bim) resolves to its entry
        merged = {**defaults, **params}
        if merged.get("target") != "all":
            entries[str(label)] = AttackEntry(str(label), name, merged)
            continue
        n_cls = _num_classes(raw.get("dataset", "cifar10"))
        _need(merged.get("targeted") is True, src, f"attack {label!r}: target: all needs targeted: true")
        _need(n_cls <= 20, src, f"attack {label!r}: target: all would make {n_cls} entries; name one class "
                                f"(target: 3) or use target: random")
        for c in range(n_cls):
            entries[f"{label}@t{c}"] = AttackEntry(f"{label}@t{c}", name, {**merged, "target": c})
    return list(entries.values())


def _surrogate_entries(raw: dict, src: str) -> list[SurrogateEntry]:
    """The surrogate rows: a model name, a list of names, or ``{models, weights, name, attacks,
    replicates, <collection options>}``; ``replicates: K`` (per row or for the grid) makes K rows
    of independently seeded replicates ``<model>@r<k>`` sharing ``surrogate_base``."""
    _need(isinstance(raw["surrogates"], list), src, "surrogates must be a non-empty list")
    grid_reps = raw.get("replicates", 1)
    _need(_is_count(grid_reps), src, f"replicates must be a positive integer, got {grid_reps!r}")
    rows: list[SurrogateEntry] = []
    for s in raw["surrogates"]:
        reps = grid_reps
        if isinstance(s, dict) and "replicates" in s:
            s = dict(s)
            reps = s.pop("replicates")
            _need(_is_count(reps), src,
                  f"surrogate set {s.get('name', s.get('models'))}: replicates must be a positive integer, got {reps!r}")
        entry = _surrogate_entry(s, raw["attacks"], src)
        if reps == 1:
            rows.append(entry)
            continue
        from ..models.catalogue import replicate_name

        for k in range(reps):
            models = tuple(replicate_name(m, k) for m in entry.models)
            rows.append(replace(entry, models=models, label=f"{entry.name}@r{k}" if k else entry.name,
                                base=entry.name, replicate=k))
    return rows


def _surrogate_entry(s: Any, attacks_raw: dict, src: str) -> SurrogateEntry:
    from ..attacks import ATTACKS

    if isinstance(s, str):
        return SurrogateEntry((s,))
    if isinstance(s, list) and s and all(isinstance(m, str) for m in s):
        return SurrogateEntry(tuple(s))
    if not (isinstance(s, dict) and isinstance(s.get("models"), list) and s["models"]):
        raise UserError(f"{src}: a surrogate must be a model name, a list of names, or "
                        f"{{models: [...], weights: [...], name: ...}}; got {s!r}")
    who = s.get("name", s["models"])
    _need(all(isinstance(m, str) for m in s["models"]), src, f"surrogate set {who}: models must be model names")
    only = s.get("attacks") or []
    _need(isinstance(only, list) and all(isinstance(a, str) for a in only), src,
          f"surrogate set {who}: attacks must be a list of attack names")
    by_size = s.get("sizes") or {}
    _need(isinstance(by_size, dict) and all(isinstance(v, dict) and set(v) == {"attacks"} for v in by_size.values()),
          src, f"surrogate set {who}: sizes must map a zoo size to {{attacks: [...]}} (the attack list at that size), "
               f"like sizes: {{converged: {{attacks: [ila, fia]}}}}")
    for size, v in by_size.items():
        _need(size in SIZES, src, f"surrogate set {who}: sizes names {size!r}, not a zoo size ({', '.join(SIZES)})")
        _need(isinstance(v["attacks"], list) and v["attacks"] and all(isinstance(a, str) for a in v["attacks"]), src,
              f"surrogate set {who}: sizes.{size}.attacks must be a non-empty list of attack names")
    for a in [*only, *(a for v in by_size.values() for a in v["attacks"])]:  # the file's own labels, or registry names
        if a not in attacks_raw:
            ATTACKS.get(a)
    w = s.get("weights")
    if isinstance(w, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in w):
        w = tuple(float(v) for v in w)  # GridSpec.validate judges them (and anything else given)
    opts = {k: v for k, v in s.items() if k not in ("models", "weights", "name", "attacks", "sizes")}
    return SurrogateEntry(tuple(s["models"]), w, str(s.get("name", "")),
                          tuple(sorted(opts.items(), key=lambda kv: str(kv[0]))), tuple(only),
                          size_attacks=tuple(sorted((k, tuple(v["attacks"])) for k, v in by_size.items())))


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1
