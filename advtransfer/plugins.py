"""Plugins: attacks, network architectures, training methods and measures from the user's own code, and model
catalogue entries from the user's own YAML, without forking the harness.

A plugin is

- a Python file (``my_attacks.py``) or an importable module (``mypkg.attacks``) that registers what
  it defines when imported: ``@register_attack(...)`` (:mod:`advtransfer.attacks`),
  ``@ARCHS.register(...)`` (:mod:`advtransfer.models.archs`: a builder taking ``num_classes`` that
  returns a network of *normalised* images, like the harness's own), ``TRAINERS`` (training methods),
  ``@register_source(...)`` (:mod:`advtransfer.models.sources`: a new kind of catalogue entry, by its YAML key),
  ``@register_measure(...)`` (:mod:`advtransfer.analysis.measures`: a table computed from a run
  folder, ``advtransfer measure RUN NAME``, shown by the report);
- a catalogue file (``my_models.yaml``, the format of ``surrogates/*.yaml``) whose entries join the
  zoo: ``arch: <registered name>`` with a ``recipe`` (the harness trains it) or with
  ``pretrained: {weights: file}`` (the user's own weights; a relative path is relative to the YAML);
- an entry point of the ``advtransfer.plugins`` group of an installed package (a module, or a
  callable called once), loaded whenever plugins are.

A grid names them under ``plugins:`` (paths relative to the grid file), the CLI with ``--plugin``
(repeatable, relative to the current folder). They are loaded before the grid's names are read, in
the main process and in every worker of every executor (:func:`advtransfer.run.executors`), code before
catalogues. The sha256 of a plugin's source file (for a module: its ``__file__``) enters the id of
every cell whose attack or surrogate network it defines and the recipe hash of every model built
from its architecture, trained by its method or of its kind of entry, so an edited plugin never
reuses a cached result.
A plugin that cannot be imported, or registers a name that exists already, is a one-line
:class:`UserError` naming it (the CLI exits 2) before anything trains or is written.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from .core.errors import UserError

ENTRY_POINT_GROUP = "advtransfer.plugins"
#: the registry tag holding the sha256 of the plugin source that registered an entry (see
#: :meth:`advtransfer.core.registry.Registry.code`): cell ids and recipe hashes read it
CODE_TAG = "plugin_sha256"
CATALOGUE_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class Plugin:
    """One loaded plugin: ``ref`` (an absolute file path, a module name, or ``entry point NAME``),
    its ``kind`` (code, module, entry point, catalogue), the ``source`` file hashed, its ``sha256``
    and what it registered (``provides``: (registry kind, name) pairs)."""

    ref: str
    kind: str
    source: str
    sha256: str
    module: str = ""
    provides: tuple[tuple[str, str], ...] = ()

    def record(self) -> dict:
        """JSON-able description (the run manifest's ``plugins``)."""
        return {"ref": self.ref, "kind": self.kind, "sha256": self.sha256,
                "provides": [f"{k} {n}" for k, n in self.provides]}


_LOADED: dict[str, Plugin] = {}            # by ref
_OWNERS: dict[tuple[str, str], Plugin] = {}  # (registry kind, name) -> plugin
_ENTRY_POINTS_DONE = False


def _registries() -> dict[str, Any]:
    from .analysis.measures.registry import MEASURES
    from .attacks import ATTACKS
    from .models.archs import ARCHS
    from .models.catalogue import SOURCE_KINDS
    from .training.base import TRAINERS

    return {ATTACKS.kind: ATTACKS, ARCHS.kind: ARCHS, TRAINERS.kind: TRAINERS, MEASURES.kind: MEASURES,
            SOURCE_KINDS.kind: SOURCE_KINDS}


def sha256_of(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def resolve_ref(ref: Any, base: str | Path | None = None, where: str = "") -> str:
    """A plugin reference as it is loaded: a file (``.py``, ``.yaml``; any path with a folder
    separator) becomes its absolute path (relative ones are relative to ``base``, else the current
    folder); anything else is a module name."""
    pre = f"{where}: " if where else ""
    if not isinstance(ref, str) or not ref.strip():
        raise UserError(f"{pre}a plugin is a file path (my_attacks.py, my_models.yaml) or a module name "
                        f"(mypkg.attacks), got {ref!r}")
    ref = ref.strip()
    if ref.endswith((".py", *CATALOGUE_SUFFIXES)) or "/" in ref or "\\" in ref:
        p = Path(ref).expanduser()
        if not p.is_absolute():
            p = Path(base or ".") / p
        if not p.is_file():
            raise UserError(f"{pre}plugin {ref!r}: no such file ({p})")
        return str(p.resolve())
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", ref):
        raise UserError(f"{pre}plugin {ref!r} is neither a file (.py, .yaml) nor a module name like mypkg.attacks")
    return ref


def load_plugins(refs: Iterable[str] = (), base: str | Path | None = None, entry_points: bool = True,
                 where: str = "") -> list[Plugin]:
    """Load the plugins ``refs`` (see :func:`resolve_ref`; code before catalogues) and, once per
    process, the installed ``advtransfer.plugins`` entry points. Idempotent: a plugin whose source
    is unchanged is not loaded again; an edited one replaces what its earlier version registered.
    Returns the plugins ``refs`` name, in order."""
    out = _load_entry_points() if entry_points else []
    resolved = [resolve_ref(r, base, where) for r in refs]
    code = [r for r in resolved if not r.endswith(CATALOGUE_SUFFIXES)]
    cats = [r for r in resolved if r.endswith(CATALOGUE_SUFFIXES)]
    loaded = {r: _load_one(r) for r in [*code, *cats]}
    return [*out, *(loaded[r] for r in resolved)]


def loaded() -> list[Plugin]:
    """Every plugin loaded in this process."""
    return list(_LOADED.values())


def owner(kind: str, name: str) -> Plugin | None:
    """The plugin that registered ``name`` in the registry of ``kind`` (attack, architecture,
    training method), or None for the harness's own."""
    return _OWNERS.get((kind, name))


# --- loading ------------------------------------------------------------------------------------
def _snapshot() -> dict[str, set[str]]:
    return {k: set(r._items) | set(r._aliases) for k, r in _registries().items()}  # noqa: SLF001


def _new_names(before: dict[str, set[str]]) -> list[tuple[str, str]]:
    out = []
    for k, r in _registries().items():
        out.extend((k, n) for n in sorted(set(r._items) - before[k]))  # noqa: SLF001 - aliases go with them
    return out


def _rollback(before: dict[str, set[str]]) -> None:
    regs = _registries()
    for k, n in _new_names(before):
        regs[k].remove(n)


def _failure(ref: str, exc: BaseException, source: str | None) -> UserError:
    """One line for a plugin that failed to load: a name registered twice, or the exception with
    the plugin's line where it was raised."""
    m = re.match(r"^(.+?) '(.+)' registered twice$", str(exc))
    if isinstance(exc, ValueError) and m:
        kind, name = m.groups()
        other = _OWNERS.get((kind, name))
        by = f"plugin {other.ref}" if other is not None else "advtransfer itself"
        return UserError(f"plugin {ref}: registers {kind} {name!r}, which {by} registered already; give it another name")
    if isinstance(exc, UserError):
        return UserError(f"plugin {ref}: {exc}")
    line = ""
    if isinstance(exc, SyntaxError) and exc.lineno:
        line = f" at line {exc.lineno}"
    elif source:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == Path(source).resolve()]
        if frames:
            line = f" at line {frames[-1].lineno}"
    text = str(exc).strip().splitlines()
    return UserError(f"plugin {ref}: cannot import it ({type(exc).__name__}{': ' + text[0] if text else ''}{line})")


def _load_one(ref: str) -> Plugin:
    if ref.endswith(CATALOGUE_SUFFIXES):
        return _load_catalogue(ref)
    if ref.endswith(".py") or Path(ref).is_absolute():
        return _import(ref, "code", ref, None)
    try:
        spec = importlib.util.find_spec(ref) if importlib.util.find_spec(ref.split(".")[0]) else None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - its parent package failed to import
        raise _failure(ref, exc, None) from None
    if spec is None:
        raise UserError(f"plugin {ref!r}: no module named {ref} (install its package, add its folder to PYTHONPATH, "
                        f"or give the file's path)")
    origin = spec.origin if spec.origin and Path(spec.origin).is_file() else None
    return _import(ref, "module", origin, ref)


def _import(ref: str, kind: str, source: str | None, module: str | None) -> Plugin:
    sha = sha256_of(source) if source else hashlib.sha256(ref.encode()).hexdigest()
    old = _LOADED.get(ref)
    if old is not None and old.sha256 == sha:
        return old
    if old is not None:  # edited since it was loaded: what it registered goes first
        _unload(old)
    before = _snapshot()
    try:
        if module is None:  # a file: imported under a name of its own content
            stem = re.sub(r"\W", "_", Path(ref).stem)
            name = f"advtransfer_plugin_{stem}_{sha[:12]}"
            spec = importlib.util.spec_from_file_location(name, ref)
            if spec is None or spec.loader is None:
                raise UserError(f"plugin {ref}: not a Python file")
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            folder = str(Path(ref).parent)
            if folder not in sys.path:  # its sibling modules import as they would beside it
                sys.path.append(folder)
            try:
                spec.loader.exec_module(mod)
            except BaseException:
                sys.modules.pop(name, None)
                raise
        else:
            name = module
            if old is not None and module in sys.modules:
                importlib.reload(sys.modules[module])
            else:
                importlib.import_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - any failure of user code is one line
        _rollback(before)
        raise _failure(ref, exc, source) from None
    plugin = Plugin(ref, kind, source or "", sha, name, tuple(_new_names(before)))
    _own(plugin)
    return plugin


def _own(plugin: Plugin) -> None:
    """Record what ``plugin`` registered, and tag each entry with its source's sha256 (what cell
    ids and recipe hashes read: :data:`CODE_TAG`)."""
    regs = _registries()
    _LOADED[plugin.ref] = plugin
    for key in plugin.provides:
        _OWNERS[key] = plugin
        regs[key[0]].retag(key[1], **{CODE_TAG: plugin.sha256, "plugin": plugin.ref})


def _unload(plugin: Plugin) -> None:
    regs = _registries()
    for k, n in plugin.provides:
        if k in regs and n in regs[k]:  # (a catalogue's models are no registry's)
            regs[k].remove(n)
        _OWNERS.pop((k, n), None)
    if plugin.kind == "catalogue":
        from .models import catalogue

        catalogue.remove_catalogue(plugin.ref)
    elif plugin.kind == "code":
        sys.modules.pop(plugin.module, None)
    _LOADED.pop(plugin.ref, None)


def _load_catalogue(ref: str) -> Plugin:
    from .models import catalogue

    sha = sha256_of(ref)
    old = _LOADED.get(ref)
    if old is not None and old.sha256 == sha:
        return old
    catalogue.add_catalogue(ref)
    try:
        names = catalogue.catalogue_names(ref)
        catalogue.load_specs()  # the whole zoo with it: a name declared twice is refused now
    except UserError as exc:
        catalogue.remove_catalogue(ref)
        raise UserError(f"plugin {ref}: {exc}") from None
    plugin = Plugin(ref, "catalogue", ref, sha, "", tuple(("model", n) for n in names))
    _LOADED[ref] = plugin
    return plugin


def _load_entry_points() -> list[Plugin]:
    global _ENTRY_POINTS_DONE
    if _ENTRY_POINTS_DONE:
        return [p for p in _LOADED.values() if p.kind == "entry point"]
    _ENTRY_POINTS_DONE = True
    from importlib.metadata import entry_points

    out = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        ref = f"entry point {ep.name} ({ep.value})"
        before = _snapshot()
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, type(sys)):
                obj()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001
            _rollback(before)
            _ENTRY_POINTS_DONE = False
            raise _failure(ref, exc, None) from None
        mod = sys.modules.get(ep.module)
        source = getattr(mod, "__file__", None)
        sha = sha256_of(source) if source and Path(source).is_file() else hashlib.sha256(ep.value.encode()).hexdigest()
        plugin = Plugin(ref, "entry point", source or "", sha, ep.module, tuple(_new_names(before)))
        _own(plugin)
        out.append(plugin)
    return out


def plugin_records(spec_plugins: Sequence[str]) -> list[dict]:
    """The manifest's record of the plugins a grid used (entry points included)."""
    names = set(spec_plugins)
    return [p.record() for p in _LOADED.values() if p.ref in names or p.kind == "entry point"]
