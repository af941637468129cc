"""The model catalogue: declarative entries in ``surrogates/*.yaml`` and ``victims/*.yaml`` read
into :class:`ModelSpec` objects, with the recipe hash that names a trained model's identity.

An entry is its common fields (name, arch, family, dataset, ...) plus one tagged source, the
:class:`Origin`: the YAML key that says where its weights come from (``recipe``, ``pretrained``,
``defence``) and the keys that kind owns. Each kind is one class of :data:`SOURCE_KINDS`
(:mod:`.sources` registers the harness's own; a plugin may register another): the catalogue asks
that class to check an entry and, through :meth:`ModelSpec.declared`, everything that depends on
the kind (identity, data variant, label set, training method)."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Iterable

import yaml

from ..core.config import SIZES, zoo_catalogue_dirs
from ..core.errors import UserError
from ..core.registry import Registry, suggest
from ..core.resources import catalogue_dirs
from ..core.rng import seeded
from ..core.utils import short_hash
from .archs import CIFAR10_MEAN, CIFAR10_STD, ImageClassifier, build_arch

#: the kinds of entry by the YAML key that declares each: classes with the interface of
#: :class:`advtransfer.models.sources.Source`, registered with
#: :func:`advtransfer.models.sources.register_source` (the harness's: ``recipe``, ``pretrained``, ``defence``)
SOURCE_KINDS: Registry[Any] = Registry("model source")
#: the kind of an entry that names none: trained from the recipe it then lacks
DEFAULT_SOURCE = "recipe"


@dataclass(frozen=True)
class Origin:
    """The tagged half of an entry: ``key``, the YAML key naming its kind (a name of
    :data:`SOURCE_KINDS`), and ``fields``, the entry's keys that kind owns, as checked by it (a
    defended entry's ``defence`` and ``base``)."""

    key: str
    fields: dict = field(default_factory=dict)

    @property
    def value(self) -> Any:
        """The value of the key itself: the recipe, pretrained or defence mapping."""
        return self.fields[self.key]

    def get(self, name: str, default: Any = None) -> Any:
        """The owned key ``name``, or ``default`` where the kind has none."""
        return self.fields.get(name, default)


@dataclass(frozen=True)
class ModelSpec:
    """One zoo entry: the fields every kind has, and ``origin``, where its weights come from.
    For a trained entry :attr:`recipe` holds the training recipe with its ``sizes``
    (ci/cpu/converged/full; a size may also name its own ``arch``)."""

    name: str
    arch: str
    family: str
    origin: Origin
    arch_kwargs: dict = field(default_factory=dict)
    dataset: str = "cifar10"
    num_classes: int = 10
    kind: str = "single"
    channels_last: bool = True
    replicates: int = 1  # independently seeded copies <name>@r1 .. @r<k-1> (replicate 0 is <name> itself)
    source: str = ""  # the catalogue file that declares it

    @property
    def recipe(self) -> dict:
        """The training recipe (empty for an entry the harness does not train)."""
        return self.origin.get("recipe", {})

    def declared(self) -> Any:
        """The source this entry declares (:class:`advtransfer.models.sources.Source`: one class
        per YAML key), bound to it; without reading any card (see :func:`advtransfer.models.sources.resolve`)."""
        return SOURCE_KINDS.get(self.origin.key)(self)

    def resolved_recipe(self, size: str) -> dict:
        """The recipe for one size: the shared keys updated with ``sizes[size]`` (a size naming
        another ``method`` than the shared one keeps only the shared ``seed``); the size's
        ``arch``/``arch_kwargs`` are not training keys (see :meth:`arch_at`)."""
        if size not in SIZES:
            raise UserError(f"unknown zoo size {size!r}; use one of {', '.join(SIZES)}")
        base = {k: v for k, v in self.recipe.items() if k != "sizes"}
        sizes = self.recipe.get("sizes", {})
        if size not in sizes:
            raise UserError(f"model {self.name!r} ({self.source}) has no recipe for size {size!r}")
        own = sizes[size].get("method") if isinstance(sizes[size], dict) else None
        if own is not None and own != base.get("method", "standard"):
            # a size trained by another method: the shared keys are the shared method's
            # hyper-parameters, so only the seed carries over
            base = {k: v for k, v in base.items() if k == "seed"}
        base.update({k: v for k, v in sizes[size].items() if k not in _SIZE_ARCH_KEYS})
        return base

    def arch_at(self, size: str | None) -> tuple[str, dict]:
        """``(arch, arch_kwargs)`` of the network at ``size``: a size may build another network of
        the entry's family (``sizes: {converged: {arch: airbench, arch_kwargs: {...}}}``: the
        converged zoo's VGG-style nets are airbench's); ``None`` or a size without one: the entry's."""
        sz = (self.recipe.get("sizes") or {}).get(size) if size is not None else None
        if not isinstance(sz, dict) or "arch" not in sz and "arch_kwargs" not in sz:
            return self.arch, self.arch_kwargs
        return sz.get("arch", self.arch), sz.get("arch_kwargs", {} if "arch" in sz else self.arch_kwargs)

    def data_variant(self, size: str):
        """The training-data variant of the entry at ``size`` (:class:`advtransfer.data.variants.DataVariant`;
        its kind decides: a recipe's, a defended entry's base's, a pretrained entry the default)."""
        return self.declared().data_variant(size)

    def label_set(self) -> str:
        """The label set the entry predicts (:data:`advtransfer.data.variants.LABEL_SETS`; the same at
        every size): ``cifar10`` (the dataset's own classes) unless its kind says another."""
        return self.declared().label_set()

    def method_version(self) -> int | None:
        """``VERSION`` of the training method of the recipe (None for an entry the harness does not train)."""
        return self.declared().method_version()

    def identity(self, size: str) -> dict:
        """Everything that determines the model at ``size`` (hashed into ``recipe_hash``), as its
        kind defines it: for a trained entry the architecture, the resolved recipe and the
        training method's version; for a pretrained one its source; for a defended one its base's
        hash and the defence (see :mod:`.sources`). A kind a plugin registered adds its source's
        sha256 (:mod:`advtransfer.plugins`): an edited kind is another model."""
        ident = self.declared().identity(size)
        code = SOURCE_KINDS.code(self.origin.key)
        return {**ident, "plugin_code": {**ident.get("plugin_code", {}), "model source": code}} if code else ident

    def recipe_hash(self, size: str) -> str:
        """Short hash of :meth:`identity`: a cached model is valid while its card holds this hash."""
        return short_hash(self.identity(size))

    def build(self, size: str | None = None) -> ImageClassifier:
        """A freshly initialised network (the one built at ``size``, see :meth:`arch_at`) wrapped to
        take pixels in [0,1] (N×3×32×32), initialised from the recipe's ``seed``; torch's global
        random state is left unchanged."""
        arch, arch_kwargs = self.arch_at(size)
        with seeded(int(self.recipe.get("seed", 0))):
            net = build_arch(arch, num_classes=self.num_classes, **arch_kwargs)
        cl = self.channels_last and not arch.startswith("vit")
        return ImageClassifier(net, CIFAR10_MEAN, CIFAR10_STD, channels_last=cl)


def plugin_code(arch: str, method: str | None = None) -> dict[str, str]:
    """The sha256 of the plugin sources that registered ``arch`` (architecture) and ``method``
    (training method); empty for the harness's own (see :mod:`advtransfer.plugins`)."""
    from ..training.base import TRAINERS
    from .archs import ARCHS

    out = {}
    for kind, reg, name in (("architecture", ARCHS, arch), ("training method", TRAINERS, method)):
        sha = reg.code(name) if name else None
        if sha:
            out[kind] = sha
    return out


#: keys every entry may have, whatever its kind (a kind may require or forbid some, see Source.parse)
COMMON_KEYS = tuple(f.name for f in fields(ModelSpec) if f.name not in ("origin", "source"))
#: keys of a size's recipe that choose the network rather than its training (see ModelSpec.arch_at)
_SIZE_ARCH_KEYS = ("arch", "arch_kwargs")


def _kind_of(entry: dict, source: str) -> Any:
    """The class of :data:`SOURCE_KINDS` whose key ``entry`` names (:data:`DEFAULT_SOURCE` if none)."""
    keys = [k for k in SOURCE_KINDS.names() if k in entry]
    if len(keys) > 1:
        raise UserError(f"{source}: model {entry.get('name', '?')!r} declares {' and '.join(keys)}; an entry "
                        f"takes one of {', '.join(SOURCE_KINDS.names())}")
    return SOURCE_KINDS.get(keys[0] if keys else DEFAULT_SOURCE)


def _spec_from_entry(entry: Any, source: str, folder: Path | None = None) -> ModelSpec:
    """The spec of one catalogue entry: its kind checks the keys it owns (and may fill in common
    ones: a defended entry's arch); one-line UserErrors. ``folder``: what relative paths in the
    entry are relative to (a plugin's catalogue: its folder; None: as written)."""
    if not isinstance(entry, dict):
        raise UserError(f"{source}: each model entry must be a mapping, got {type(entry).__name__}")
    cls = _kind_of(entry, source)
    entry = cls.parse(dict(entry), source, folder)
    owned = {k: entry[k] for k in cls.keys() if k in entry}
    extra = set(entry) - set(COMMON_KEYS) - set(owned)
    if extra:
        raise UserError(f"{source}: model {entry['name']!r} has unknown keys {sorted(extra)}; "
                        f"allowed: {sorted(set(COMMON_KEYS) | set(cls.keys()))}")
    reps = entry.get("replicates", 1)
    if not isinstance(reps, int) or isinstance(reps, bool) or reps < 1:
        raise UserError(f"{source}: model {entry['name']!r}: replicates must be a positive integer, got {reps!r}")
    if "@" in str(entry["name"]):
        raise UserError(f"{source}: model name {entry['name']!r} may not contain '@' (reserved for @epoch<k> and @r<k>)")
    common = {k: entry[k] for k in COMMON_KEYS if k in entry}
    return ModelSpec(**common, origin=Origin(cls.key, owned), source=source)


def zoo_dirs() -> list[Path]:
    """Folders holding model YAML files: $ADVTRANSFER_ZOO (os.pathsep-separated), else the
    shipped ``surrogates/`` and ``victims/`` (see :func:`advtransfer.core.resources.catalogue_dirs`)."""
    return zoo_catalogue_dirs() or catalogue_dirs()


#: parsed catalogue files by path: (text, document). A run reads the catalogue many times and
#: PyYAML's parser is slow; a file whose text changed is parsed again.
_PARSED: dict[str, tuple[str, Any]] = {}


def _parse_catalogue(path: Path) -> Any:
    """``yaml.safe_load`` of ``path``, from :data:`_PARSED` when its text is unchanged (a deep copy:
    callers may modify what they get)."""
    text = path.read_text()
    hit = _PARSED.get(str(path))
    if hit is None or hit[0] != text:
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UserError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
        hit = _PARSED[str(path)] = (text, doc)
    return copy.deepcopy(hit[1])


#: catalogue files added by plugins (advtransfer.plugins), read after the zoo folders
_EXTRA_CATALOGUES: list[Path] = []


def add_catalogue(path: str | Path) -> None:
    """Read the catalogue file ``path`` with the zoo folders from now on (a plugin's own models)."""
    p = Path(path).resolve()
    if p not in _EXTRA_CATALOGUES:
        _EXTRA_CATALOGUES.append(p)


def remove_catalogue(path: str | Path) -> None:
    p = Path(path).resolve()
    if p in _EXTRA_CATALOGUES:
        _EXTRA_CATALOGUES.remove(p)


def catalogue_names(path: str | Path) -> list[str]:
    """The model names a catalogue file declares."""
    doc = _parse_catalogue(Path(path))
    entries = (doc or {}).get("models", []) if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise UserError(f"{path}: expected a top-level 'models:' list")
    return [str(e.get("name")) for e in entries if isinstance(e, dict)]


#: the specs of a catalogue by its files' (path, text): a run asks for them many times per command
_SPECS: dict[tuple[tuple[str, str], ...], dict[str, "ModelSpec"]] = {}


def load_specs(dirs: Iterable[Path] | None = None) -> dict[str, ModelSpec]:
    """All model entries of the zoo folders, by name (names are unique across files). The entries
    are shared between calls while the files are unchanged: treat them as read-only."""
    paths = [path for d in (dirs or zoo_dirs()) for path in sorted(Path(d).glob("*.yaml"))]
    if dirs is None:  # and the catalogue files plugins added (advtransfer.plugins)
        paths += [p for p in _EXTRA_CATALOGUES if p not in paths]
    key = tuple((str(p), p.read_text()) for p in paths)
    if key not in _SPECS:
        _SPECS.clear()
        _SPECS[key] = _load_specs(paths)
    return dict(_SPECS[key])


def _load_specs(paths: list[Path]) -> dict[str, ModelSpec]:
    """The entries of catalogue files ``paths``, parsed."""
    specs: dict[str, ModelSpec] = {}
    for path in paths:
        doc = _parse_catalogue(path)
        entries = (doc or {}).get("models", []) if isinstance(doc, dict) else None
        if not isinstance(entries, list):
            raise UserError(f"{path}: expected a top-level 'models:' list")
        folder = path.parent if path in _EXTRA_CATALOGUES else None  # a plugin's: paths relative to it
        for entry in entries:
            spec = _spec_from_entry(entry, str(path), folder)
            if spec.name in specs:
                raise UserError(f"model {spec.name!r} is declared twice ({specs[spec.name].source}, {path})")
            specs[spec.name] = spec
    for spec in specs.values():  # entries naming others (a defended entry's base) once all are read
        spec.declared().check_references(specs)
    return specs


#: seed offset between replicates: replicate k trains with the recipe's seed + k·REPLICATE_SEED_STEP
REPLICATE_SEED_STEP = 1000


def split_checkpoint(name: str) -> tuple[str, int | None]:
    """``'resnet20_std@epoch2'`` → ``('resnet20_std', 2)``, ``'resnet20_std@r1@epoch2'`` →
    ``('resnet20_std@r1', 2)``; a name without a checkpoint → ``(name, None)``."""
    base, sep, tail = name.rpartition("@")
    if not sep or (tail.startswith("r") and tail[1:].isdigit()):
        return name, None
    if not (tail.startswith("epoch") and tail[5:].isdigit()):
        raise UserError(f"model {name!r}: a checkpoint is named <entry>@epoch<k> (like resnet20_std@epoch2) and a "
                        f"replicate <entry>@r<k> (like resnet20_a@r1)")
    return base, int(tail[5:])


def split_replicate(name: str) -> tuple[str, int]:
    """``'resnet20_a@r2'`` → ``('resnet20_a', 2)``; ``'resnet20_a'`` → ``('resnet20_a', 0)``
    (a checkpoint suffix must be split off first, see :func:`split_checkpoint`)."""
    base, sep, tail = name.rpartition("@")
    if sep and tail.startswith("r") and tail[1:].isdigit():
        return base, int(tail[1:])
    return name, 0


def replicate_name(name: str, k: int) -> str:
    """The name of replicate ``k`` of model ``name`` (a checkpoint keeps its suffix):
    ``replicate_name('resnet20_std@epoch2', 1)`` → ``'resnet20_std@r1@epoch2'``; k = 0 is ``name``."""
    base, epoch = split_checkpoint(name)
    root, _ = split_replicate(base)
    if k == 0:
        return f"{root}" + (f"@epoch{epoch}" if epoch is not None else "")
    return f"{root}@r{k}" + (f"@epoch{epoch}" if epoch is not None else "")


def _replicate_spec(spec: ModelSpec, k: int, specs: dict[str, ModelSpec]) -> ModelSpec:
    """Replicate ``k`` of ``spec``, as its kind makes one (a trained entry: the same recipe with
    seed + k·1000, see :func:`replicate_recipe`)."""
    if k >= spec.replicates:
        raise UserError(f"model {spec.name}@r{k}: {spec.name!r} declares {spec.replicates} replicate(s) "
                        f"({spec.source}); add `replicates: {k + 1}` to its entry")
    return spec.declared().replicate(k, specs)


def replicate_recipe(recipe: dict, k: int, specs: dict[str, ModelSpec]) -> dict:
    """The recipe of replicate ``k``: seed + k·1000 (shared and per size); a recipe continuing from
    another entry (``init_from``) continues from that entry's replicate k when it declares one."""

    def shift(d: dict) -> dict:
        d = dict(d)
        if "seed" in d:
            d["seed"] = int(d["seed"]) + k * REPLICATE_SEED_STEP
        if d.get("init_from"):
            base = get_spec(d["init_from"], specs)
            if base.replicates > k:
                d["init_from"] = replicate_name(d["init_from"], k)
        return d

    out = shift(recipe)
    out.setdefault("seed", k * REPLICATE_SEED_STEP)
    if "sizes" in out:
        out["sizes"] = {size: shift(v) for size, v in out["sizes"].items()}
    return out


def get_spec(name: str, specs: dict[str, ModelSpec] | None = None) -> ModelSpec:
    """The entry ``name``; ``<entry>@epoch<k>`` is the checkpoint kept after epoch k of a recipe
    with ``keep_epochs`` (kind ``es``, early stopping), trained together with its entry;
    ``<entry>@r<k>`` is its k-th independently seeded replicate (the entry declares ``replicates``)."""
    specs = load_specs() if specs is None else specs
    base, epoch = split_checkpoint(name)
    if epoch is not None:
        return replace(get_spec(base, specs), name=name, kind="es")
    root, k = split_replicate(name)
    if k > 0:
        return _replicate_spec(get_spec(root, specs), k, specs)
    if name not in specs:
        raise UserError(suggest(name, list(specs), "model") + "; models are declared in surrogates/*.yaml and victims/*.yaml")
    return specs[name]
