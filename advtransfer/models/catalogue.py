"""The model catalogue: declarative entries in ``surrogates/*.yaml`` and ``victims/*.yaml`` read
into :class:`ModelSpec` objects, with the recipe hash that names a trained model's identity."""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

import yaml

from ..core.config import SIZES, zoo_catalogue_dirs
from ..core.errors import UserError
from ..core.registry import suggest
from ..core.resources import catalogue_dirs
from ..core.rng import seeded
from ..core.utils import short_hash
from .archs import CIFAR10_MEAN, CIFAR10_STD, ImageClassifier, build_arch


@dataclass(frozen=True)
class ModelSpec:
    """One zoo entry. ``recipe`` holds the training recipe with its ``sizes`` (ci/cpu/converged/full; a size may also name its own ``arch``)."""

    name: str
    arch: str
    family: str
    recipe: dict
    arch_kwargs: dict = field(default_factory=dict)
    dataset: str = "cifar10"
    num_classes: int = 10
    kind: str = "single"
    channels_last: bool = True
    pretrained: dict | None = None  # open_clip / timm pretrained entry (not trained): see models/pretrained.py
    replicates: int = 1  # independently seeded copies <name>@r1 .. @r<k-1> (replicate 0 is <name> itself)
    base: str | None = None  # a defended entry: the zoo entry behind the defence
    defence: dict | None = None  # a defended entry: the defence (see models/defences.py)
    source: str = ""

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
        """The training-data variant of the recipe at ``size`` (:class:`advtransfer.data.variants.DataVariant`);
        a defended entry has its base's, a pretrained entry the default."""
        from ..data.variants import DataVariant

        if self.defence is not None:
            return get_spec(self.base).data_variant(size)
        if self.pretrained is not None:
            return DataVariant()
        return DataVariant.from_recipe(self.resolved_recipe(size), f"{self.source}: model {self.name!r}")

    def label_set(self) -> str:
        """The label set the entry predicts (:data:`advtransfer.data.variants.LABEL_SETS`; the same at
        every size): ``cifar10`` (the dataset's own classes) unless its recipe declares another."""
        if self.defence is not None:
            return get_spec(self.base).label_set()
        if self.pretrained is not None or not self.recipe.get("sizes"):
            return "cifar10"
        return self.data_variant(next(iter(self.recipe["sizes"]))).labels

    def method_version(self) -> int | None:
        """``VERSION`` of the training method of the recipe (None for a pretrained or defended entry)."""
        if self.pretrained is not None or self.defence is not None:
            return None
        from ..training import method_version

        return method_version(self.recipe.get("method", "standard"))

    def identity(self, size: str) -> dict:
        """Everything that determines the trained weights (hashed into ``recipe_hash``): the
        architecture, the resolved recipe and the training method's version; for a recipe
        continuing from another entry (``init_from``) that entry's hash too; for a pretrained
        entry its source (architecture, tag or weights file)."""
        if self.pretrained is not None:
            from .pretrained import identity

            return identity(self)
        if self.defence is not None:
            from .defences import identity as defence_identity, resolve

            return {"base": self.base, "base_hash": get_spec(self.base).recipe_hash(size),
                    "defence": defence_identity(resolve(self.defence, self.source))}
        from ..core.config import train_threads

        recipe = self.resolved_recipe(size)
        arch, arch_kwargs = self.arch_at(size)
        ident: dict[str, Any] = {"arch": arch, "arch_kwargs": arch_kwargs, "dataset": self.dataset,
                                 "num_classes": self.num_classes, "recipe": recipe,
                                 "threads": train_threads(recipe)}  # pinned in training: weights depend on it
        code = plugin_code(arch, str(recipe.get("method", "standard")))
        if code:  # an architecture or training method of a plugin: its source's sha256 (advtransfer.plugins)
            ident["plugin_code"] = code
        version = self.method_version()
        if version != 1:
            # version 1 is each method's code as it was when versions were introduced: left out of
            # the hash so that models trained before then stay valid; any bump changes the hash
            ident["method_version"] = version
        if ident["recipe"].get("data"):  # how variants select and shift images is code: versioned
            from ..data.variants import VERSION as variants_version

            ident["variants_version"] = variants_version
        base = ident["recipe"].get("init_from")
        if base:
            ident["init_from_hash"] = get_spec(base).recipe_hash(size)
        sources = ident["recipe"].get("sources")
        if sources:  # static models a defence trains against (ensemble_at, pubdef)
            ident["sources_hash"] = {s: get_spec(s).recipe_hash(size) for s in sources}
        return ident

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


_REQUIRED = ("name", "arch", "family", "recipe")
#: keys of a size's recipe that choose the network rather than its training (see ModelSpec.arch_at)
_SIZE_ARCH_KEYS = ("arch", "arch_kwargs")


def _spec_from_entry(entry: Any, source: str) -> ModelSpec:
    if not isinstance(entry, dict):
        raise UserError(f"{source}: each model entry must be a mapping, got {type(entry).__name__}")
    missing = [k for k in _REQUIRED if k not in entry]
    if "defence" in entry:  # a defence wrapping another entry: no weights, no recipe of its own
        missing = [k for k in ("name", "base", "family") if k not in entry]
        if missing:
            raise UserError(f"{source}: defended entry {entry.get('name', '?')!r} lacks {', '.join(missing)}")
        if "recipe" in entry or "pretrained" in entry or "arch" in entry:
            raise UserError(f"{source}: defended entry {entry['name']!r} takes base and defence only "
                            f"(its architecture and weights are its base's)")
        from .defences import resolve

        resolve(entry["defence"], f"{source}: model {entry['name']!r}")
        if entry["base"] == entry["name"]:
            raise UserError(f"{source}: defended entry {entry['name']!r} cannot be its own base")
        entry = {"recipe": {}, "kind": "defended", "arch": "defended", **entry}
        missing = []
    elif "pretrained" in entry:  # not trained by the harness: no recipe
        missing = [k for k in ("name", "arch", "family") if k not in entry]
        entry = {"recipe": {}, "kind": "pretrained", **entry}
    if missing:
        raise UserError(f"{source}: model entry {entry.get('name', '?')!r} lacks {', '.join(missing)}")
    known = set(ModelSpec.__dataclass_fields__) - {"source"}
    extra = set(entry) - known
    if extra:
        raise UserError(f"{source}: model {entry['name']!r} has unknown keys {sorted(extra)}; "
                        f"allowed: {sorted(known)}")
    reps = entry.get("replicates", 1)
    if not isinstance(reps, int) or isinstance(reps, bool) or reps < 1:
        raise UserError(f"{source}: model {entry['name']!r}: replicates must be a positive integer, got {reps!r}")
    if "@" in str(entry["name"]):
        raise UserError(f"{source}: model name {entry['name']!r} may not contain '@' (reserved for @epoch<k> and @r<k>)")
    if "pretrained" in entry:
        from .pretrained import check_entry

        check_entry(entry["name"], entry["arch"], entry["pretrained"], source)
    elif "defence" in entry:
        pass
    elif not isinstance(entry["recipe"], dict) or "sizes" not in entry["recipe"]:
        raise UserError(f"{source}: model {entry['name']!r} needs recipe.sizes with ci/cpu/full")
    else:  # a training-data variant (advtransfer.data.variants): checked here, its label set sizes the head
        from ..data.variants import DataVariant

        where = f"{source}: model {entry['name']!r}"
        rec = entry["recipe"]
        sizes = [v for v in rec["sizes"].values() if isinstance(v, dict)]
        # a size's data replaces the shared one (as resolved_recipe does)
        labels = {DataVariant.from_recipe({"data": sz.get("data", rec.get("data"))}, where).labels for sz in sizes}
        if len(labels) > 1:
            raise UserError(f"{where}: every size must predict the same label set, got {sorted(labels)}")
        if labels and labels != {"cifar10"}:
            n_cls = DataVariant(labels=labels.pop()).num_classes
            if entry.get("num_classes", n_cls) != n_cls:
                raise UserError(f"{where}: num_classes {entry['num_classes']} does not match its label set ({n_cls} classes)")
            entry = {**entry, "num_classes": n_cls}
    return ModelSpec(**{k: entry[k] for k in entry}, source=source)


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


def _weights_beside(entries: list, path: Path) -> None:
    """A plugin catalogue's relative ``pretrained.weights`` paths are relative to the file."""
    for e in entries:
        pre = e.get("pretrained") if isinstance(e, dict) else None
        w = pre.get("weights") if isinstance(pre, dict) else None
        if (isinstance(w, str) and w and not w.startswith("hf-hub:")
                and not Path(os.path.expandvars(w)).expanduser().is_absolute()):
            pre["weights"] = str(path.parent / w)


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
        if path in _EXTRA_CATALOGUES:
            _weights_beside(entries, path)
        for entry in entries:
            spec = _spec_from_entry(entry, str(path))
            if spec.name in specs:
                raise UserError(f"model {spec.name!r} is declared twice ({specs[spec.name].source}, {path})")
            specs[spec.name] = spec
    for spec in specs.values():
        if spec.defence is not None:
            root = split_replicate(split_checkpoint(spec.base)[0])[0]
            if root not in specs:
                raise UserError(f"{spec.source}: defended entry {spec.name!r}: " + suggest(spec.base, list(specs), "base model"))
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
    """Replicate ``k`` of ``spec``: the same recipe with seed + k·1000; a recipe continuing from
    another entry (``init_from``) continues from that entry's replicate k when it declares one."""
    if k >= spec.replicates:
        raise UserError(f"model {spec.name}@r{k}: {spec.name!r} declares {spec.replicates} replicate(s) "
                        f"({spec.source}); add `replicates: {k + 1}` to its entry")

    def shift(d: dict) -> dict:
        d = dict(d)
        if "seed" in d:
            d["seed"] = int(d["seed"]) + k * REPLICATE_SEED_STEP
        if d.get("init_from"):
            base = get_spec(d["init_from"], specs)
            if base.replicates > k:
                d["init_from"] = replicate_name(d["init_from"], k)
        return d

    recipe = shift(spec.recipe)
    recipe.setdefault("seed", k * REPLICATE_SEED_STEP)
    if "sizes" in recipe:
        recipe["sizes"] = {size: shift(v) for size, v in recipe["sizes"].items()}
    return replace(spec, name=f"{spec.name}@r{k}", recipe=recipe)


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
