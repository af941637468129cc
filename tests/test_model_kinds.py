"""A new kind of model entry is one class and one YAML key (issue 56): this module registers a
throwaway kind, ``init_only`` (a network at its seeded random initialisation, never trained), with
one call, writes a catalogue that uses its key, and the zoo parses, hashes, cards and loads models
of it, a defended entry around one included, with no harness file changed. Its catalogue half is
the defaults of :class:`advtransfer.models.sources.Source` (identity: the declaration as written)
with one check of its own.

A catalogue of its own (ADVTRANSFER_ZOO → a temporary folder) and the session's temporary cache;
tinycnn at width 8, so preparing takes seconds."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
import yaml

from advtransfer.core.errors import UserError
from advtransfer.core.rng import seeded
from advtransfer.models import zoo
from advtransfer.models.archs import CIFAR10_MEAN, CIFAR10_STD, ImageClassifier, build_arch
from advtransfer.models.catalogue import SOURCE_KINDS
from advtransfer.models.sources import Source, register_source


@dataclass(frozen=True)
class InitOnlySource(Source):
    """``init_only: {seed: <int>}``: the entry's network at the random initialisation of that seed."""

    kind: ClassVar[str] = "init_only"
    trains: ClassVar[bool] = False

    @classmethod
    def parse(cls, entry: dict, where: str, folder=None) -> dict:
        entry = super().parse(entry, where, folder)
        seed = entry["init_only"].get("seed") if isinstance(entry["init_only"], dict) else None
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise UserError(f"{where}: model {entry['name']!r}: init_only needs an integer seed, got {seed!r}")
        return entry

    def is_ready(self, size: str, cache=None) -> bool:
        card = zoo.read_card(self.name, size, cache)
        return card is not None and card.get("recipe_hash") == self.spec.recipe_hash(size)

    def prepare(self, size: str, cache=None, data_dir=None, device: str = "cpu", progress: bool = True,
                log=print) -> dict:
        from advtransfer.core.metrics import labels
        from advtransfer.models.loading import eval_split

        model = self.load(size, cache, device)
        x, y = eval_split(self.spec.dataset, data_dir)
        acc = float((labels(model, x, 500, device) == y).double().mean())
        card = zoo.make_card(self.spec, size, kind=self.kind, recipe=None, members=[""], clean_acc=acc,
                             clean_acc_images=f"test 0-{len(x) - 1}", sha256=self.spec.recipe_hash(size), device=device)
        zoo.write_card(card, cache)
        return card

    def load(self, size: str | None = None, cache=None, device: str = "cpu") -> torch.nn.Module:
        spec = self.spec
        with seeded(int(spec.origin.value["seed"])):
            net = build_arch(spec.arch, num_classes=spec.num_classes, **spec.arch_kwargs)
        return ImageClassifier(net, CIFAR10_MEAN, CIFAR10_STD).eval().to(device)


TINY = {"arch": "tinycnn", "arch_kwargs": {"width": 8}, "family": "cnn"}
ENTRIES = [
    {"name": "rand_a", **TINY, "init_only": {"seed": 7}},
    {"name": "rand_b", **TINY, "init_only": {"seed": 8}},
    {"name": "rand_a_jpeg", "base": "rand_a", "family": "defended", "defence": {"kind": "jpeg", "quality": 75}},
]


@pytest.fixture
def kinds_zoo(tmp_path, monkeypatch, cache_dir):
    register_source("init_only")(InitOnlySource)  # the one registry call a new kind needs
    d = tmp_path / "zoo"
    d.mkdir()
    (d / "kinds_test.yaml").write_text(yaml.safe_dump({"models": ENTRIES}))
    monkeypatch.setenv("ADVTRANSFER_ZOO", str(d))
    yield d
    SOURCE_KINDS.remove("init_only")


def test_a_new_kind_is_one_class_and_one_yaml_key(kinds_zoo):
    a, b = zoo.get_spec("rand_a"), zoo.get_spec("rand_b")
    assert a.origin == zoo.Origin("init_only", {"init_only": {"seed": 7}}) and a.recipe == {}
    assert zoo.resolve("rand_a", "ci").kind == "init_only" and isinstance(zoo.declared(a), InitOnlySource)
    # the default identity is the declaration as written: another seed is another model
    assert a.recipe_hash("ci") != b.recipe_hash("ci") and a.method_version() is None and a.label_set() == "cifar10"
    assert not zoo.is_trained(a, "ci")

    zoo.ensure_trained(["rand_a_jpeg"], "ci", progress=False, log=lambda *_: None)  # prepares its base first
    assert zoo.is_trained(a, "ci") and zoo.is_trained(zoo.get_spec("rand_a_jpeg"), "ci")
    assert zoo.read_card("rand_a", "ci")["kind"] == "init_only"
    assert zoo.declared(a).cache_state("ci").startswith("acc ")

    x = torch.rand(4, 3, 32, 32)
    with torch.no_grad():
        out = zoo.load_model("rand_a", "ci")(x)
        assert out.shape == (4, 10) and torch.equal(out, zoo.load_model("rand_a", "ci", member=0)(x))
        assert not torch.equal(out, zoo.load_model("rand_b", "ci")(x))
        assert zoo.load_model("rand_a_jpeg", "ci")(x).shape == (4, 10)
    with pytest.raises(UserError, match="no weights of its own") as err:
        zoo.load_states("rand_a", "ci")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("entry, msg", [
    ({"name": "r", **TINY, "init_only": {"seed": "7"}}, "init_only needs an integer seed"),
    ({"name": "r", **TINY, "init_only": {"seed": 7}, "recipe": {"sizes": {}}}, "declares init_only and recipe"),
    ({"name": "r", "family": "cnn", "init_only": {"seed": 7}}, "lacks arch"),
    ({"name": "r", **TINY, "init_only": {"seed": 7}, "base": "x"}, "unknown keys"),
])
def test_bad_entries_of_a_new_kind_get_one_clear_line(kinds_zoo, entry, msg):
    from advtransfer.models.catalogue import load_specs

    (kinds_zoo / "kinds_test.yaml").write_text(yaml.safe_dump({"models": [entry]}))
    with pytest.raises(UserError, match=msg) as err:
        load_specs([kinds_zoo])
    assert "\n" not in str(err.value) and "kinds_test.yaml" in str(err.value)


KIND_PLUGIN = '''
"""The user's own kind of entry: `zero_init: {}`, a network whose weights are all zero."""
from dataclasses import dataclass

import torch

from advtransfer.models import zoo
from advtransfer.models.sources import Source, register_source


@register_source("zero_init")
@dataclass(frozen=True)
class ZeroInit(Source):
    kind = "zero_init"
    trains = False

    def is_ready(self, size, cache=None):
        card = zoo.read_card(self.name, size, cache)
        return card is not None and card["recipe_hash"] == self.spec.recipe_hash(size)

    def prepare(self, size, cache=None, data_dir=None, device="cpu", progress=True, log=print):
        card = zoo.make_card(self.spec, size, kind=self.kind, recipe=None, members=[""], clean_acc=None,
                             clean_acc_images=None, sha256=self.spec.recipe_hash(size), device=device)
        zoo.write_card(card, cache)
        return card

    def load(self, size=None, cache=None, device="cpu"):
        net = self.spec.build(size)
        for p in net.parameters():
            torch.nn.init.zeros_(p)
        return net.eval().to(device)
'''


def test_a_plugin_file_adds_a_kind_and_its_code_enters_the_recipe_hash(tmp_path, cache_dir, monkeypatch):
    """The user's path: one plugin file with the class and one catalogue file with the key."""
    from advtransfer import plugins

    monkeypatch.setenv("ADVTRANSFER_ZOO", str(tmp_path / "none"))
    (tmp_path / "kind.py").write_text(KIND_PLUGIN)
    (tmp_path / "zeros.yaml").write_text(yaml.safe_dump({"models": [{"name": "zeros_a", **TINY, "zero_init": {}}]}))
    before = set(plugins._LOADED)
    try:
        plugins.load_plugins([str(tmp_path / "kind.py"), str(tmp_path / "zeros.yaml")], entry_points=False)
        assert plugins.owner("model source", "zero_init").ref == str(tmp_path / "kind.py")
        spec = zoo.get_spec("zeros_a")
        ident, h = spec.identity("ci"), spec.recipe_hash("ci")
        assert ident["plugin_code"] == {"model source": plugins.sha256_of(tmp_path / "kind.py")}
        zoo.ensure_trained(["zeros_a"], "ci", progress=False, log=lambda *_: None)
        with torch.no_grad():
            assert torch.count_nonzero(zoo.load_model("zeros_a", "ci")(torch.rand(2, 3, 32, 32))) == 0
        # an edited kind is another model: its card is stale
        (tmp_path / "kind.py").write_text(KIND_PLUGIN + "\n# edited\n")
        plugins.load_plugins([str(tmp_path / "kind.py")], entry_points=False)
        assert zoo.get_spec("zeros_a").recipe_hash("ci") != h
        assert not zoo.is_trained(zoo.get_spec("zeros_a"), "ci")
    finally:
        for ref in set(plugins._LOADED) - before:
            plugins._unload(plugins._LOADED[ref])
    assert "zero_init" not in SOURCE_KINDS
