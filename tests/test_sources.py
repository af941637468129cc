"""Model sources (issue 30): resolve() turns a catalogue name into one tagged source (trained,
collection, pretrained, defended) and load_model returns what a grid attacks for that name: the
collection itself for an LGV/cSGLD/SWAG-style entry, whose build parameters the cell keeps.

A catalogue of its own (ADVTRANSFER_ZOO → a temporary folder) with tiny networks: the collection
(cSGLD, 2 samples) trains on 256 images in seconds into the session's temporary cache."""
from __future__ import annotations

import json
import types

import pytest
import torch
import yaml

import advtransfer
from advtransfer.core.errors import UserError
from advtransfer.models import zoo
from advtransfer.models.collections import MemberCollection

SGD = {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "batch_size": 64, "seed": 3}
TINY = {"arch": "tinycnn", "arch_kwargs": {"width": 8}, "family": "cnn"}
ENTRIES = [
    {"name": "src_single", **TINY, "recipe": {**SGD, "method": "standard", "sizes": {"ci": {"epochs": 1, "train_subset": 256}}}},
    {"name": "src_csgld", **TINY, "kind": "csgld",
     "recipe": {**SGD, "method": "csgld", "lr": 0.5, "momentum": 0.0,
                "sizes": {"ci": {"epochs": 2, "train_subset": 256, "cycles": 2, "samples_per_cycle": 1,
                                 "noise_fraction": 0.25}}}},
    {"name": "src_jpeg", "base": "src_single", "family": "defended", "defence": {"kind": "jpeg", "quality": 75}},
    {"name": "src_random", "arch": "timm/resnet10t", "family": "timm", "dataset": "imagenet", "num_classes": 10,
     "pretrained": {"random_init": True}},
]


@pytest.fixture
def sources_zoo(tmp_path, monkeypatch, cache_dir):
    d = tmp_path / "zoo"
    d.mkdir()
    (d / "sources_test.yaml").write_text(yaml.safe_dump({"models": ENTRIES}))
    monkeypatch.setenv("ADVTRANSFER_ZOO", str(d))
    return cache_dir


def test_resolve_tags_each_kind_once(sources_zoo):
    kinds = {e["name"]: zoo.resolve(e["name"], "ci").kind for e in ENTRIES}
    # untrained, the collection is a trained entry: only its card says it holds several weight sets
    assert kinds == {"src_single": "trained", "src_csgld": "trained", "src_jpeg": "defended", "src_random": "pretrained"}
    for e in ENTRIES:
        spec = zoo.get_spec(e["name"])
        src = zoo.resolve(spec, "ci")
        assert src.spec == spec and src.identity("ci") == spec.identity("ci")
    assert zoo.resolve("src_single@epoch1", "ci").kind == "trained"
    assert [zoo.declared(zoo.get_spec(n)).has_weights for n in ("src_single", "src_jpeg", "src_random")] == [True, False, False]
    with pytest.raises(UserError) as err:
        zoo.resolve("src_nonesuch", "ci")
    assert "\n" not in str(err.value) and "src_nonesuch" in str(err.value)


def test_load_model_returns_the_collection_a_grid_attacks(sources_zoo, tmp_path):
    from advtransfer.run.cellrunner import ModelCache, surrogate_key, surrogate_params
    from advtransfer.run.context import RunContext

    zoo.ensure_trained(["src_csgld", "src_single"], "ci", progress=False, log=lambda *_: None)
    card = zoo.read_card("src_csgld", "ci")
    assert zoo.resolve("src_csgld", "ci").kind == "collection" and len(card["members"]) == 2
    assert zoo.resolve("src_single", "ci").kind == "trained"

    coll = advtransfer.load_model("src_csgld", size="ci")
    assert isinstance(coll, MemberCollection) and len(coll.members) == 2 and coll.per_step == 1
    first = zoo.load_model("src_csgld", "ci", member=0)
    members = zoo.load_members("src_csgld", "ci")
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), members[0].state_dict().values()))
    assert not isinstance(zoo.load_model("src_single", "ci"), MemberCollection)
    with pytest.raises(UserError, match="no member 2"):
        zoo.load_model("src_csgld", "ci", member=2)
    with pytest.raises(UserError, match="member 0 only"):
        zoo.load_model("src_jpeg", "ci", member=1)

    # the same module a grid attacks, and the row records what it was built with
    x = torch.rand(4, 3, 32, 32)
    cache = ModelCache("ci", RunContext(tmp_path, device="cpu"))
    grid_coll = cache.surrogate("src_csgld", {})
    coll.reset()
    grid_coll.reset()
    assert torch.equal(coll.draw_logits(x, 0), grid_coll.draw_logits(x, 0))
    opts = {"per_step": 2}
    cache.surrogate("src_csgld", opts)
    assert cache.params[surrogate_key("src_csgld", opts)] == {**card["surrogate_params"], "K": 2, "per_step": 2, "seed": 0}
    cell = types.SimpleNamespace(surrogate=types.SimpleNamespace(models=["src_csgld"], options=opts))
    row = json.loads(surrogate_params(cell, {"src_csgld": card}, cache.params))
    assert row["per_step"] == 2 and row["K"] == 2 and row["seed"] == 0 and row["cycles"] == 2
    with pytest.raises(UserError, match="is a collection"):
        cache.surrogate("src_csgld", {"posterior": "gaussian"})
    with pytest.raises(UserError, match="need a collection"):
        cache.surrogate("src_single", {"per_step": 2})
