"""Where a zoo model comes from, decided once: each kind of catalogue entry is one class here,
registered by the YAML key that declares it (:func:`register_source`), and everything that
checks, hashes, trains, cards or loads a model asks its source.

========================  ========  ======================================================
class                     YAML key  the entry
========================  ========  ======================================================
:class:`TrainedSource`    recipe    trained by the harness from its recipe into one network
                                    (also an ``<entry>@epoch<k>`` checkpoint and an ``<entry>@r<k>`` replicate)
:class:`CollectionSource` (recipe)  trained by the harness into several weight sets or a SWAG posterior
                                    (LGV, cSGLD, SWAG): a grid attacks it as a collection
:class:`PretrainedSource` pretrained published weights (open_clip, timm, cifar_hub, RobustBench), carded once
:class:`DefendedSource`   defence   a test-time defence around another entry (its ``base``); no weights of its own
========================  ========  ======================================================

A catalogue entry is parsed into its common fields plus the :class:`~.catalogue.Origin` of its
kind (:mod:`.catalogue`); :func:`declared` (:meth:`ModelSpec.declared
<advtransfer.models.catalogue.ModelSpec.declared>`) binds the kind's class to the entry without
reading a card, for questions that do not depend on one (its identity, how it is prepared,
whether it has weights to ship). Whether a trained entry is a collection shows in its card
(several members, or kind ``swag``), so :func:`resolve` asks the declared source for the one at
the size asked for (:meth:`Source.at`).

A new kind is one subclass of :class:`Source` registered under its YAML key; it answers
:meth:`~Source.is_ready`, :meth:`~Source.prepare` and :meth:`~Source.load`, and overrides the
catalogue half (:meth:`~Source.parse`, :meth:`~Source.identity`, ...) where the defaults do not fit.

Nothing here changes torch's global random state: networks are initialised and trained under
:func:`advtransfer.core.rng.seeded`.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Union

import torch.nn as nn

from ..core.config import default_size
from ..core.errors import UserError
from ..core.registry import suggest
from ..core.utils import sha256_file
from .cards import make_card, read_card, write_card
from .catalogue import (SOURCE_KINDS, ModelSpec, get_spec, load_specs, plugin_code, replicate_recipe,
                        split_checkpoint, split_replicate)
from .collections import build_collection, build_posterior, is_collection
from .loading import (FULL_TEST_SIZES, eval_images_label, eval_split, instantiate, load_networks, load_states,
                      whole_test_accuracy)
from .store import locate, save_states, shipped_hash, shipped_paths, verify_checksum, zoo_paths

if TYPE_CHECKING:
    from ..data import Split
    from ..training.base import TrainOutput
    from ..training.context import TrainingContext

Cache = Union[str, os.PathLike, None]
Log = Callable[[str], object]


def register_source(key: str) -> Callable[[type], type]:
    """Class decorator: the kind of catalogue entry declared by the YAML key ``key`` (a
    :class:`Source` subclass; it becomes the class's ``key``). Unregister with ``SOURCE_KINDS.remove(key)``."""

    def deco(cls: type) -> type:
        cls.key = key
        SOURCE_KINDS.add(key, cls)
        return cls

    return deco


@dataclass(frozen=True)
class Source:
    """What every kind of entry answers, bound to one entry (``spec``). The defaults are those of
    an entry with one network, no weights file of its own and no training recipe (pretrained,
    defended); a kind must add :meth:`is_ready`, :meth:`prepare` and :meth:`load`."""

    spec: ModelSpec
    #: the YAML key that declares the kind (set by :func:`register_source`)
    key: ClassVar[str]
    #: the tag: trained, collection, pretrained or defended
    kind: ClassVar[str]
    #: holds its own weights file in the zoo (checked against its card, shipped by `zoo ship`)
    has_weights: ClassVar[bool] = False
    #: preparing it may train a network (its own, or a defended entry's base): it needs the training split
    trains: ClassVar[bool] = True
    #: keys an entry of the kind must have, and how an error names such an entry
    required: ClassVar[tuple[str, ...]] = ("name", "arch", "family")
    noun: ClassVar[str] = "model entry"
    #: YAML keys the kind owns besides its own (a defended entry's ``base``): kept in its Origin
    also_owns: ClassVar[tuple[str, ...]] = ()

    # --- the catalogue half: what the entry is, without reading the cache ---------------------
    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The YAML keys the kind owns (its :class:`~.catalogue.Origin` holds them)."""
        return (cls.key, *cls.also_owns)

    @classmethod
    def parse(cls, entry: dict, where: str, folder: Path | None = None) -> dict:
        """Check a catalogue entry of this kind and return it with the kind's defaults filled in
        (one-line UserErrors; ``where`` is the catalogue file). ``folder``: what relative paths
        in the entry are relative to (None: as written). Here: the :attr:`required` keys."""
        missing = [k for k in cls.required if k not in entry]
        if missing:
            raise UserError(f"{where}: {cls.noun} {entry.get('name', '?')!r} lacks {', '.join(missing)}")
        return entry

    def check_references(self, specs: dict[str, ModelSpec]) -> None:
        """One-line UserError if the entry names another that catalogue ``specs`` lacks (here: none)."""

    @property
    def name(self) -> str:
        return self.spec.name

    def describe(self) -> str:
        """The entry's kind in words, for messages."""
        return f"a {self.kind} entry"

    def identity(self, size: str) -> dict:
        """Everything that determines the model at ``size`` (hashed into its card's ``recipe_hash``,
        see :meth:`ModelSpec.recipe_hash <advtransfer.models.catalogue.ModelSpec.recipe_hash>`).
        Here: the network's declaration and the keys the kind owns, as written."""
        spec = self.spec
        return {"arch": spec.arch, "arch_kwargs": spec.arch_kwargs, "dataset": spec.dataset,
                "num_classes": spec.num_classes, **spec.origin.fields}

    def data_variant(self, size: str):
        """The training-data variant (:class:`advtransfer.data.variants.DataVariant`); here the default."""
        from ..data.variants import DataVariant

        return DataVariant()

    def label_set(self) -> str:
        """The label set it predicts (:data:`advtransfer.data.variants.LABEL_SETS`); here ``cifar10``."""
        return "cifar10"

    def method_version(self) -> int | None:
        """``VERSION`` of its training method (None: not trained by the harness)."""
        return None

    def replicate(self, k: int, specs: dict[str, ModelSpec]) -> ModelSpec:
        """The spec of replicate ``k`` (``<entry>@r<k>``); here the same entry under that name."""
        return replace(self.spec, name=f"{self.spec.name}@r{k}")

    # --- the cache half: preparing, checking and loading the model ------------------------------
    def is_ready(self, size: str, cache: Cache = None) -> bool:
        """Whether the model is prepared at ``size`` with the current entry."""
        raise NotImplementedError

    def prepare(self, size: str, cache: Cache = None, data_dir: str | os.PathLike | None = None,
                device: str = "cpu", progress: bool = True, log: Log = print) -> dict:
        """Prepare it at ``size`` (train, load once, card) and write its card; returns the card."""
        raise NotImplementedError

    def load(self, size: str | None = None, cache: Cache = None, device: str = "cpu") -> nn.Module:
        """The module a grid attacks for it: eval mode, pixels in [0,1] (N×3×H×W) to logits."""
        raise NotImplementedError

    def at(self, size: str, cache: Cache = None) -> "Source":
        """The source at ``size`` once its card is read (a trained entry may be a collection); here itself."""
        return self

    def require_weights(self) -> None:
        """One-line UserError unless the entry holds weights of its own (:func:`~.loading.load_states`)."""
        raise UserError(f"model {self.name!r} is {self.describe()} and has no weights of its own")

    def check(self, size: str, cache: Cache = None) -> None:
        """One-line UserError if weights on disk no longer match the card (nothing to check here)."""

    def summary(self, card: dict) -> str | None:
        """The line ``ensure_trained`` logs after :meth:`prepare` wrote ``card`` (None: none)."""
        return None

    def member(self, index: int, size: str | None = None, cache: Cache = None, device: str = "cpu") -> nn.Module:
        """Network ``index`` of the entry (0: the only one)."""
        if index != 0:
            raise UserError(f"model {self.name!r} is one network: it has member 0 only, not {index}")
        return self.load(size, cache, device)

    def members(self, size: str | None = None, cache: Cache = None, device: str = "cpu") -> list[nn.Module]:
        """Every network of the entry as an eval-mode module (here: the one)."""
        return [self.load(size, cache, device)]

    def attacked(self, options: dict[str, Any], size: str, cache: Cache = None, device: str = "cpu",
                 data_dir: str | os.PathLike | None = None, plain: Callable[[], nn.Module] | None = None
                 ) -> tuple[nn.Module, dict]:
        """(the module a grid attacks for this entry with surrogate ``options``, the parameters it
        is drawn with for the results table: the grid's options and the values used, defaults
        included; empty for the plain network). ``plain``: the loaded network, where the caller
        holds it already. A single network takes no options but posterior smoothing."""
        plain = plain or (lambda: self.load(size, cache, device))
        if not options:
            return plain(), {}
        if "posterior" not in options:
            raise UserError(f"surrogate options {sorted(options)} need a collection; {self.name!r} is a single model")
        return build_posterior(self.name, plain(), read_card(self.name, size, cache) or {}, options, data_dir)

    def trains_at(self, size: str, specs: dict[str, ModelSpec] | None = None) -> bool:
        """Whether ``zoo train`` prepares it at ``size`` by default (no: it is loaded when named)."""
        return False

    def recipe_at(self, size: str) -> dict | None:
        """The training recipe at ``size`` (resolved, see :meth:`ModelSpec.resolved_recipe
        <advtransfer.models.catalogue.ModelSpec.resolved_recipe>`); None: not trained by the harness."""
        return None

    def network(self, size: str | None = None) -> nn.Module:
        """A network with the entry's layers, for listing them: freshly initialised (no training)."""
        size = size or default_size()
        self.spec.identity(size)  # an unknown size or one the entry lacks: one line before anything is built
        return self.spec.build(size)

    def arch_name(self, size: str | None = None) -> str:
        """The architecture of its network at ``size``."""
        return self.spec.arch_at(size or default_size())[0]

    def cache_state(self, size: str, cache: Cache = None) -> str:
        """How it stands in the cache at ``size``, in words (``zoo list``)."""
        card = read_card(self.name, size, cache)
        if card is None:
            from ..training.resume import saved_epoch

            try:  # a run cut off that `zoo train` resumes (an entry without this size has none)
                epoch = saved_epoch(resume_path(self.spec, size, cache)) if self.recipe_at(size) else None
            except UserError:
                epoch = None
            return "missing" if epoch is None else f"missing (a stopped run resumes after epoch {epoch} on `zoo train`)"
        current = card.get("recipe_hash") == self.spec.recipe_hash(size)
        state = f"acc {card['clean_acc']:.3f}" if current else "stale (recipe changed)"
        if current and shipped_hash(self.name, size) == card.get("recipe_hash"):
            state += " (shipped)"
        return state


@register_source("recipe")
@dataclass(frozen=True)
class TrainedSource(Source):
    """An entry the harness trains from its recipe into one network (an ``@epoch<k>``
    checkpoint and an ``@r<k>`` replicate are trained ones too)."""

    kind: ClassVar[str] = "trained"
    has_weights: ClassVar[bool] = True
    required: ClassVar[tuple[str, ...]] = ("name", "arch", "family", "recipe")

    @classmethod
    def parse(cls, entry: dict, where: str, folder: Path | None = None) -> dict:
        """A recipe with ``sizes``; a training-data variant (:mod:`advtransfer.data.variants`) is
        checked here, and its label set sizes the head (``num_classes``)."""
        from ..data.variants import DataVariant

        entry = super().parse(entry, where, folder)
        if not isinstance(entry["recipe"], dict) or "sizes" not in entry["recipe"]:
            raise UserError(f"{where}: model {entry['name']!r} needs recipe.sizes with ci/cpu/full")
        where = f"{where}: model {entry['name']!r}"
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
        return entry

    def identity(self, size: str) -> dict:
        """The architecture, the resolved recipe and the training method's version; for a recipe
        continuing from another entry (``init_from``) that entry's hash too, and the hashes of
        the static models it trains against (``sources``)."""
        from ..core.config import train_threads

        spec = self.spec
        recipe = spec.resolved_recipe(size)
        arch, arch_kwargs = spec.arch_at(size)
        ident: dict[str, Any] = {"arch": arch, "arch_kwargs": arch_kwargs, "dataset": spec.dataset,
                                 "num_classes": spec.num_classes, "recipe": recipe,
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

    def data_variant(self, size: str):
        """The variant its recipe at ``size`` declares."""
        from ..data.variants import DataVariant

        return DataVariant.from_recipe(self.spec.resolved_recipe(size), f"{self.spec.source}: model {self.name!r}")

    def label_set(self) -> str:
        sizes = self.spec.recipe.get("sizes")
        return self.data_variant(next(iter(sizes))).labels if sizes else "cifar10"

    def method_version(self) -> int | None:
        from ..training import method_version

        return method_version(self.spec.recipe.get("method", "standard"))

    def replicate(self, k: int, specs: dict[str, ModelSpec]) -> ModelSpec:
        """The same recipe with seed + k·1000 (see :func:`~.catalogue.replicate_recipe`)."""
        origin = replace(self.spec.origin, fields={**self.spec.origin.fields,
                                                   "recipe": replicate_recipe(self.spec.recipe, k, specs)})
        return replace(self.spec, name=f"{self.spec.name}@r{k}", origin=origin)

    def at(self, size: str, cache: Cache = None) -> Source:
        """A :class:`CollectionSource` once its card at ``size`` holds several weight sets (or a
        SWAG posterior); before it is trained, itself."""
        return CollectionSource(self.spec) if is_collection(read_card(self.name, size, cache) or {}) else self

    def require_weights(self) -> None:
        """It holds weights of its own."""

    def is_ready(self, size: str, cache: Cache = None) -> bool:
        """Trained with the current recipe: a card holding its recipe hash, and its weights file."""
        card = read_card(self.name, size, cache)
        weights, _ = locate(self.name, size, cache)
        return card is not None and card.get("recipe_hash") == self.spec.recipe_hash(size) and weights.is_file()

    def check(self, size: str, cache: Cache = None) -> None:
        """Its weights must still match the sha256 on its card (see :func:`check_checkpoint`)."""
        card = read_card(self.name, size, cache) or {}
        weights, _ = locate(self.name, size, cache)
        if weights.is_file():
            verify_checksum(weights, card.get("sha256"), self.name)

    def prepare(self, size: str, cache: Cache = None, data_dir: str | os.PathLike | None = None,
                device: str = "cpu", progress: bool = True, log: Log = print) -> dict:
        """Train it (with the models it depends on) and write its weights and card; returns the card."""
        name, spec = self.name, self.spec
        stale = shipped_hash(name, size)
        if stale == spec.recipe_hash(size):  # shipped and current, but its weights file is gone
            raise UserError(f"shipped model {name!r} lacks its weights {shipped_paths(name, size)[0]}; "
                            f"restore it from the repository (git checkout -- zoo/)")
        if stale is not None:  # shipped, but the catalogue's recipe has changed since
            log(f"{name}: the shipped weights ({shipped_paths(name, size)[0].parent}) were trained with "
                f"another recipe (hash {stale}, catalogue {spec.recipe_hash(size)}); training it afresh into the cache")
        log(f"training {name} ({spec.arch_at(size)[0]}, size {size}) ...")
        return train_spec(spec, size, cache, data_dir, device, progress)

    def summary(self, card: dict) -> str | None:
        return (f"  {self.name}: clean accuracy {card['clean_acc']:.3f} on "
                f"{card.get('clean_acc_images') or 'test 0-999'}, {card['train_s']:.0f} s")

    def load(self, size: str | None = None, cache: Cache = None, device: str = "cpu") -> nn.Module:
        """Its network: eval mode, pixels in [0,1] (N×3×32×32) to logits; weights checked against the card."""
        return self.member(0, size, cache, device)

    def member(self, index: int, size: str | None = None, cache: Cache = None, device: str = "cpu") -> nn.Module:
        """Weight set ``index`` (in the card's ``members`` order) as an eval-mode network."""
        size = size or default_size()
        spec, _card, states = load_states(self.name, size, cache)
        keys = list(states)
        if not 0 <= index < len(keys):
            raise UserError(f"model {self.name!r} has {len(keys)} weight set(s) at size {size}: no member {index}")
        return instantiate(spec, states[keys[index]], self.name, size).to(device)

    def members(self, size: str | None = None, cache: Cache = None, device: str = "cpu") -> list[nn.Module]:
        """Every weight set as an eval-mode network."""
        return load_networks(self.name, size, cache, device)

    def trains_at(self, size: str, specs: dict[str, ModelSpec] | None = None) -> bool:
        return size in self.spec.recipe.get("sizes", {})

    def recipe_at(self, size: str) -> dict | None:
        return self.spec.resolved_recipe(size)


@dataclass(frozen=True)
class CollectionSource(TrainedSource):
    """A trained entry holding several weight sets (LGV snapshots, cSGLD samples) or a SWAG
    posterior: a grid attacks it as a collection (:mod:`advtransfer.models.collections`) that
    draws weight sets per attack iteration."""

    kind: ClassVar[str] = "collection"

    def load(self, size: str | None = None, cache: Cache = None, device: str = "cpu") -> nn.Module:
        """The collection a grid attacks when it gives no options (one draw per iteration, seed 0;
        a SWAG collection refreshes BatchNorm on training images of the default data folder)."""
        return self.attacked({}, size or default_size(), cache, device)[0]

    def attacked(self, options: dict[str, Any], size: str, cache: Cache = None, device: str = "cpu",
                 data_dir: str | os.PathLike | None = None, plain: Callable[[], nn.Module] | None = None
                 ) -> tuple[nn.Module, dict]:
        if "posterior" in options:
            raise UserError(f"posterior smoothing wraps a single trained model; {self.name!r} is a collection")
        return build_collection(self.name, read_card(self.name, size, cache) or {}, options, size, cache, device,
                                data_dir)


@register_source("pretrained")
@dataclass(frozen=True)
class PretrainedSource(Source):
    """Published weights (open_clip, timm, cifar_hub, RobustBench; see :mod:`.pretrained`): loaded
    once to write its card, built from its hub tag or weights file at every load."""

    kind: ClassVar[str] = "pretrained"
    trains: ClassVar[bool] = False

    @classmethod
    def parse(cls, entry: dict, where: str, folder: Path | None = None) -> dict:
        """The ``pretrained:`` mapping (see :func:`.pretrained.check_entry`); a relative ``weights``
        path is relative to ``folder`` where one is given."""
        from .pretrained import check_entry

        entry = {"kind": "pretrained", **super().parse(entry, where, folder)}
        pre = entry["pretrained"]
        w = pre.get("weights") if isinstance(pre, dict) and folder is not None else None
        if (isinstance(w, str) and w and not w.startswith("hf-hub:")
                and not Path(os.path.expandvars(w)).expanduser().is_absolute()):
            entry["pretrained"] = {**pre, "weights": str(folder / w)}
        check_entry(entry["name"], entry["arch"], entry["pretrained"], where)
        return entry

    def identity(self, size: str) -> dict:
        """Its declaration and source (see :func:`.pretrained.identity`: for cifar_hub the release
        URL and pinned sha256 prefix, for robustbench the model it names)."""
        from .pretrained import identity

        return identity(self.spec)

    def is_ready(self, size: str, cache: Cache = None) -> bool:
        """Loaded once and carded with the current entry."""
        card = read_card(self.name, size, cache)
        return card is not None and card.get("recipe_hash") == self.spec.recipe_hash(size)

    def prepare(self, size: str, cache: Cache = None, data_dir: str | os.PathLike | None = None,
                device: str = "cpu", progress: bool = True, log: Log = print) -> dict:
        """Load it once and write its card (see :func:`prepare_pretrained`); returns the card."""
        log(f"loading pretrained {self.name} ({self.spec.arch}) ...")
        return prepare_pretrained(self.spec, size, cache, data_dir, device)

    def load(self, size: str | None = None, cache: Cache = None, device: str = "cpu") -> nn.Module:
        """The model (pixels in [0,1] at any size, to logits), from its hub tag or local weights file."""
        from .pretrained import build_pretrained

        return build_pretrained(self.spec, device)

    def network(self, size: str | None = None) -> nn.Module:
        from .pretrained import build_pretrained

        return build_pretrained(self.spec, "cpu")

    def arch_name(self, size: str | None = None) -> str:
        return self.spec.arch

    def cache_state(self, size: str, cache: Cache = None) -> str:
        card = read_card(self.name, size, cache)
        pre = self.spec.origin.value
        tag = pre.get("tag") or pre.get("weights") or "random init (tests only)"
        return f"pretrained {tag}: " + ("loaded" if card is not None and card.get("recipe_hash") == self.spec.recipe_hash(size)
                                        else "not loaded yet (needs internet or a weights file)")


@register_source("defence")
@dataclass(frozen=True)
class DefendedSource(Source):
    """A test-time defence (:mod:`.defences`) around its ``base`` entry: no weights of its own;
    current while its base is the same trained model."""

    kind: ClassVar[str] = "defended"
    required: ClassVar[tuple[str, ...]] = ("name", "base", "family")
    noun: ClassVar[str] = "defended entry"
    also_owns: ClassVar[tuple[str, ...]] = ("base",)

    @classmethod
    def parse(cls, entry: dict, where: str, folder: Path | None = None) -> dict:
        """``base`` and ``defence`` only: its architecture and weights are its base's."""
        from .defences import resolve as resolve_defence

        entry = super().parse(entry, where, folder)
        if "arch" in entry:  # another kind's key is refused before (an entry declares one kind)
            raise UserError(f"{where}: defended entry {entry['name']!r} takes base and defence only "
                            f"(its architecture and weights are its base's)")
        resolve_defence(entry["defence"], f"{where}: model {entry['name']!r}")
        if entry["base"] == entry["name"]:
            raise UserError(f"{where}: defended entry {entry['name']!r} cannot be its own base")
        return {"kind": "defended", "arch": "defended", **entry}

    @property
    def base(self) -> str:
        """The entry the defence wraps."""
        return self.spec.origin.fields["base"]

    @property
    def defence(self) -> dict:
        """The defence mapping as written (:func:`.defences.resolve` fills in its defaults)."""
        return self.spec.origin.value

    def check_references(self, specs: dict[str, ModelSpec]) -> None:
        """Its base must be an entry of the catalogue (or a checkpoint or replicate of one)."""
        if split_replicate(split_checkpoint(self.base)[0])[0] not in specs:
            raise UserError(f"{self.spec.source}: defended entry {self.name!r}: " + suggest(self.base, list(specs), "base model"))

    def describe(self) -> str:
        return f"a defence around {self.base!r}"

    def identity(self, size: str) -> dict:
        """Its base's hash and the defence with its defaults."""
        from .defences import identity as defence_identity, resolve as resolve_defence

        return {"base": self.base, "base_hash": get_spec(self.base).recipe_hash(size),
                "defence": defence_identity(resolve_defence(self.defence, self.spec.source))}

    def data_variant(self, size: str):
        """Its base's."""
        return get_spec(self.base).data_variant(size)

    def label_set(self) -> str:
        """Its base's."""
        return get_spec(self.base).label_set()

    def is_ready(self, size: str, cache: Cache = None) -> bool:
        """Carded around the base's current weights, and the base is ready."""
        card = read_card(self.name, size, cache)
        base = read_card(self.base, size, cache)
        return (card is not None and base is not None and card.get("recipe_hash") == self.spec.recipe_hash(size)
                and card.get("base_sha256") == base.get("sha256") and declared(get_spec(self.base)).is_ready(size, cache))

    def prepare(self, size: str, cache: Cache = None, data_dir: str | os.PathLike | None = None,
                device: str = "cpu", progress: bool = True, log: Log = print) -> dict:
        """Train its base if needed and write its card (see :func:`prepare_defended`); returns the card."""
        log(f"defending {self.base} with {self.defence['kind']} as {self.name} ...")
        return prepare_defended(self.spec, size, cache, data_dir, device, progress)

    def summary(self, card: dict) -> str | None:
        return (f"  {self.name}: clean accuracy {card['clean_acc']:.3f} on test 0-999 "
                f"(base {self.base}: {card['base_clean_acc']:.3f})")

    def load(self, size: str | None = None, cache: Cache = None, device: str = "cpu") -> nn.Module:
        """The defence around its base's network (a collection's first member)."""
        from .defences import Defended, resolve as resolve_defence

        base = load_model(self.base, size, cache, device, member=0)
        return Defended(base, resolve_defence(self.defence, self.spec.source)).eval()

    def trains_at(self, size: str, specs: dict[str, ModelSpec] | None = None) -> bool:
        """Prepared at a size its base is trained at."""
        specs = load_specs() if specs is None else specs
        base = specs.get(split_replicate(split_checkpoint(self.base)[0])[0])
        return base is not None and declared(base).trains_at(size, specs)


def declared(spec: ModelSpec) -> Source:
    """The source ``spec`` declares in the catalogue (its YAML key's class, bound to it), without
    reading any card; a trained entry is a collection only once its card says so (see :func:`resolve`)."""
    return spec.declared()


def resolve(name: str | ModelSpec, size: str | None = None, cache: Cache = None,
            specs: dict[str, ModelSpec] | None = None) -> Source:
    """The tagged source of zoo entry ``name`` at ``size`` (default:
    :func:`advtransfer.core.config.default_size`): the source it declares (:func:`declared`) as
    it stands at ``size`` (:meth:`Source.at`: a trained entry whose card at ``size`` holds several
    weight sets, or a SWAG posterior, is a :class:`CollectionSource`; before it is trained it
    resolves as a :class:`TrainedSource`). An unknown name is a one-line UserError."""
    spec = name if isinstance(name, ModelSpec) else get_spec(name, specs)
    return declared(spec).at(size or default_size(), cache)


def is_trained(spec: ModelSpec, size: str, cache: Cache = None) -> bool:
    """Trained (or, for a pretrained entry, loaded once and carded; for a defended one, carded
    around its base's current weights) with the current recipe."""
    return declared(spec).is_ready(size, cache)


def check_checkpoint(spec: ModelSpec, size: str, cache: Cache = None) -> None:
    """A trained model's weights must still match the sha256 on its card; else a one-line
    UserError (checked before a run trains or writes anything: a corrupt checkpoint is refused,
    never loaded, and never silently retrained, which at full size could cost days)."""
    declared(spec).check(size, cache)


def _pretrained_sha(spec: ModelSpec, size: str) -> str:
    """The checksum of a local weights file, else of the entry (hub weights are pinned by their
    tag); for a plugin's architecture, combined with the plugin source's sha256: a network whose
    code changed is another model, though its weights file is the same."""
    import hashlib

    from .catalogue import plugin_code
    from .pretrained import loader_of

    from .pretrained import weights_file

    weights = weights_file(spec)  # a Hub reference: the fetched file
    sha = sha256_file(Path(weights)) if weights else spec.recipe_hash(size)
    kind, name = loader_of(spec.arch)
    code = plugin_code(name) if kind == "arch" else {}
    return hashlib.sha256(f"{sha}|{code['architecture']}".encode()).hexdigest() if code else sha


def prepare_pretrained(spec: ModelSpec, size: str | None = None, cache: str | os.PathLike | None = None,
                       data_dir: str | os.PathLike | None = None, device: str = "cpu") -> dict:
    """Load a pretrained entry once (downloading its weights, or failing with one line offline),
    measure its clean accuracy on test images 0-999 where the dataset has a test split, and write
    its card; returns the card."""
    from ..training.base import accuracy
    from .pretrained import build_pretrained

    size = size or default_size()
    t0 = time.perf_counter()
    model = build_pretrained(spec, device)
    load_s = time.perf_counter() - t0
    acc, images = None, None
    try:
        x, y = eval_split(spec.dataset, data_dir)
        acc, images = accuracy(model, x, y, device=device), f"test 0-{len(x) - 1}"
    except UserError:
        pass
    card = make_card(
        spec, size, kind="random_init" if spec.origin.value.get("random_init") else "pretrained",
        recipe=None, members=[""], clean_acc=acc, clean_acc_images=images,
        # the checksum of a local weights file, else of the entry (hub weights are pinned by their tag)
        sha256=_pretrained_sha(spec, size),
        n_params=sum(p.numel() for p in model.parameters()), device=device,
        pretrained=spec.origin.value, load_s=round(load_s, 2))
    write_card(card, cache)
    return card


def prepare_defended(spec: ModelSpec, size: str | None = None, cache: str | os.PathLike | None = None,
                     data_dir: str | os.PathLike | None = None, device: str = "cpu", progress: bool = True) -> dict:
    """Card a defended entry (a defence wrapping a trained base): train its base if needed,
    measure its clean accuracy (draw 0) on test images 0-999 and write the card; its ``sha256``
    hashes the base's weights checksum with the defence, so the victim checksum in every row
    changes with either. Returns the card."""
    import hashlib
    import json

    from ..core.metrics import labels
    from .defences import identity as defence_identity, resolve

    size = size or default_size()
    src = DefendedSource(spec)
    ensure_trained([src.base], size, cache, data_dir, device, progress)
    base_card = read_card(src.base, size, cache)
    defence = resolve(src.defence, spec.source)
    model = load_model(spec.name, size, cache, device)
    x, y = eval_split(spec.dataset, data_dir)
    t0 = time.perf_counter()
    acc = float((labels(model, x, 500, device) == y).double().mean())
    sha = hashlib.sha256(f"{base_card['sha256']}|{json.dumps(defence_identity(defence), sort_keys=True)}"
                         .encode()).hexdigest()
    card = make_card(spec, size, kind="defended", recipe=None, members=[""], clean_acc=acc,
                     clean_acc_images=f"test 0-{len(x) - 1}", sha256=sha,
                     n_params=sum(p.numel() for p in model.parameters()), device=device,
                     base=src.base, base_sha256=base_card["sha256"], base_clean_acc=base_card.get("clean_acc"),
                     defence=defence, eval_s=round(time.perf_counter() - t0, 2))
    write_card(card, cache)
    return card


def resume_path(spec: ModelSpec, size: str, cache: Cache = None) -> Path:
    """Where a resumable training run of ``spec`` at ``size`` keeps its state between epochs
    (:mod:`advtransfer.training.resume`): in the cache, keyed by the recipe hash."""
    return zoo_paths(spec.name, size, cache)[0].parent / ".resume" / f"{spec.name}-{spec.recipe_hash(size)}.pt"


def train_spec(spec: ModelSpec, size: str | None = None, cache: str | os.PathLike | None = None,
               data_dir: str | os.PathLike | None = None, device: str = "cpu", progress: bool = True) -> dict:
    """Train one zoo entry at ``size`` and write its weights and card atomically; returns the card.
    An ``<entry>@epoch<k>`` checkpoint is written by training its entry."""
    from ..data import load_dataset
    from ..training.base import accuracy

    size = size or default_size()
    base, epoch = split_checkpoint(spec.name)
    if epoch is not None:
        if not is_trained(get_spec(base), size, cache):
            with train_lock(base, size, cache):
                if not is_trained(get_spec(base), size, cache):
                    train_spec(get_spec(base), size, cache, data_dir, device, progress)
        card = read_card(spec.name, size, cache)
        if card is None:
            raise UserError(f"{spec.name!r}: entry {base!r} keeps no checkpoint after epoch {epoch}; "
                            f"add {epoch} to its recipe's keep_epochs")
        return card
    recipe = dict(spec.resolved_recipe(size))  # only the recipe: the run-time facts go in the TrainingContext
    variant = spec.data_variant(size)
    train = load_dataset(spec.dataset, "train", data_dir)
    if not variant.is_default:  # the declared source, balance, shift and label set
        from ..data.variants import apply_variant

        train = apply_variant(train, variant, recipe.get("train_subset"))
    net = spec.build(size)
    head_reset: list[str] = []
    if recipe.get("init_from"):
        ensure_trained([recipe["init_from"]], size, cache, data_dir, device, progress)
        head_reset = _load_start(net, load_model(recipe["init_from"], size, cache, member=0), spec, recipe["init_from"])
    ctx = _training_context(spec, recipe, size, cache, data_dir, device, progress)
    out, train_s, made_by = _train_pinned(net, recipe, train, ctx)
    x, y = eval_split(spec.dataset, data_dir, variant)
    images = eval_images_label(x, variant)
    accs = {}
    for member in out.meta.get("model_members", list(out.states)):
        net.load_state_dict(out.states[member])
        accs[member] = accuracy(net.to(device), x, y, device=device)
    n_params = sum(p.numel() for p in net.parameters())
    params = out.meta.get("surrogate_params", {})
    kept = []
    for key, sd in out.checkpoints.items():  # early-stopped entries <name>@epoch<k> (kind es)
        k = int(key[len("epoch"):])
        net.load_state_dict(sd)
        name = f"{spec.name}@{key}"
        sha = save_states(zoo_paths(name, size, cache)[0], {"": sd})
        write_card(make_card(
            spec, size, name=name, kind="es", recipe=recipe, members=[""],
            clean_acc=accuracy(net.to(device), x, y, device=device), clean_acc_images=images, sha256=sha,
            n_params=n_params, device=device, checkpoint_of=spec.name, provenance=made_by,
            surrogate_params={"epoch": k, "epochs": int(recipe["epochs"]),
                              **{p: v for p, v in params.items() if p != "epochs"}}), cache)
        kept.append(k)
    extra = {}
    if size in FULL_TEST_SIZES and variant.is_default and list(out.states) == [""]:
        net.load_state_dict(out.states[""])
        extra["clean_acc_test"] = whole_test_accuracy(net.to(device), spec.dataset, data_dir, device)
    sha = save_states(zoo_paths(spec.name, size, cache)[0], out.states)
    card = make_card(spec, size, recipe=recipe, members=list(out.states), clean_acc=sum(accs.values()) / len(accs),
                     clean_acc_members=accs, clean_acc_images=images, train_s=train_s, sha256=sha,
                     n_params=n_params, device=device, surrogate_params=params, meta=out.meta,
                     epochs_kept=sorted(kept), provenance=made_by, data=variant.describe(), **extra,
                     **({"init_from": recipe["init_from"], "head_reinitialised": head_reset}
                        if recipe.get("init_from") else {}))
    write_card(card, cache)
    ctx.resume.unlink(missing_ok=True)  # the model is complete: its resume state has served
    return card


def _training_context(spec: ModelSpec, recipe: dict, size: str, cache: Cache, data_dir: str | os.PathLike | None,
                      device: str, progress: bool) -> TrainingContext:
    """The run-time side of training ``spec`` at ``size`` (made here once, never put in the recipe):
    its name, device, progress flag, the resume file a resumable method saves to after every epoch
    (:func:`resume_path`: a run cut off continues) and the recipe's static ``sources`` (ensemble_at,
    pubdef), trained first if needed and loaded frozen on ``device``."""
    from ..training.context import TrainingContext

    sources = {}
    if recipe.get("sources"):
        ensure_trained(list(recipe["sources"]), size, cache, data_dir, device, progress)
        sources = {s: load_model(s, size, cache, device, member=0) for s in recipe["sources"]}
    return TrainingContext(name=spec.name, device=device, progress=progress, resume=resume_path(spec, size, cache),
                           sources=sources)


def _train_pinned(net: nn.Module, recipe: dict, train: Split, ctx: TrainingContext
                  ) -> tuple[TrainOutput, float, dict]:
    """Train ``net`` on ``train`` with the recipe's pinned thread count; returns the output, the
    training seconds (every sitting of a resumed run that recorded its time) and the provenance."""
    from ..core.config import train_threads
    from ..core.rng import pinned_threads, provenance
    from ..training import train_from_recipe

    threads = train_threads(recipe)
    t0 = time.perf_counter()
    with pinned_threads(threads):
        out = train_from_recipe(net, recipe, train, ctx)
    train_s = time.perf_counter() - t0
    if out.meta.get("resumed_at_epochs"):  # earlier sittings' epochs count too (None: not recorded by them)
        train_s += out.meta.get("train_s_earlier") or 0.0
    return out, train_s, provenance(ctx.device, threads)


def _load_start(net: nn.Module, start: nn.Module, spec: ModelSpec, source: str) -> list[str]:
    """Load the weights of ``source`` (an ``init_from`` entry) into ``net``. Where the two
    predict different label sets, the classifier head's tensors (the only ones whose shapes
    differ) keep their fresh initialisation: a downstream model fine-tuned from a pre-trained one.
    Returns the names of those tensors."""
    own, theirs = net.state_dict(), start.state_dict()
    differ = sorted(k for k in own if k in theirs and own[k].shape != theirs[k].shape)
    missing = sorted(set(own) ^ set(theirs))
    if missing or (differ and spec.num_classes == get_spec(source).num_classes):
        raise UserError(f"model {spec.name!r}: init_from {source!r} does not fit its architecture "
                        f"({(missing or differ)[0]} differs); init_from needs the same architecture")
    net.load_state_dict({k: v for k, v in theirs.items() if k not in differ}, strict=False)
    return differ


def train_lock(name: str, size: str, cache: Cache = None, log: Log = print):
    """The lock under which one process at a time prepares ``name`` at ``size`` in ``cache``
    (:class:`advtransfer.core.lock.TrainLock`, a file in the cache's ``zoo/<size>/.locks/``)."""
    from ..core.lock import TrainLock

    return TrainLock(zoo_paths(name, size, cache)[0].parent / ".locks" / f"{name}.lock", name, log)


def ensure_trained(names: Iterable[str], size: str | None = None, cache: Cache = None,
                   data_dir: str | os.PathLike | None = None, device: str = "cpu", progress: bool = True,
                   log: Log = print) -> list[dict]:
    """Train those of ``names`` (with the models they depend on) that are missing or stale, load
    pretrained ones once to write their cards; returns the cards in the order of ``names``.

    Processes sharing a cache prepare each entry once: the first takes the entry's training lock
    (:class:`advtransfer.core.lock.TrainLock`), the others wait for it and then find it ready."""
    size = size or default_size()
    specs = load_specs()
    cards = []
    for name in dict.fromkeys(names):
        src = declared(get_spec(name, specs))
        if not src.is_ready(size, cache):
            with train_lock(name, size, cache, log):
                if not src.is_ready(size, cache):  # another process may have prepared it meanwhile
                    line = src.summary(src.prepare(size, cache, data_dir, device, progress, log))
                    if line is not None:
                        log(line)
        cards.append(read_card(name, size, cache))
    return cards


def load_model(name: str, size: str | None = None, cache: Cache = None, device: str = "cpu",
               member: int | None = None) -> nn.Module:
    """The module a grid attacks for zoo entry ``name`` when it gives no surrogate options: an
    eval-mode ``nn.Module`` taking pixels in [0,1] (N×3×32×32) and returning logits, its weights'
    sha256 checked against the card. For a collection (LGV, cSGLD, SWAG) that is the collection
    (one weight set drawn per attack iteration, see :mod:`.collections`); a pretrained entry
    (open_clip, timm) is built from its hub tag or weights file and takes pixels in [0,1] at any
    size; a defended entry is the defence around its base.

    ``member``: one network instead, weight set ``member`` of a collection (0: the first; the
    model itself for any other entry). :func:`load_members` gives all of them.
    """
    src = resolve(name, size, cache)
    if member is None:
        return src.load(size, cache, device)
    return src.member(member, size, cache, device)


def load_members(name: str, size: str | None = None, cache: Cache = None,
                 device: str = "cpu") -> list[nn.Module]:
    """All weight sets of a zoo entry as eval-mode modules (one for a single model)."""
    return declared(get_spec(name)).members(size, cache, device)
