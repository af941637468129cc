"""Replicate surrogates and what produced the weights: <entry>@r<k> is an independently seeded
copy; a grid row runs over replicates; training pins its thread count and the card records it."""
from __future__ import annotations

import pytest
import torch
import yaml

from advtransfer.core.errors import UserError
from advtransfer.models import get_spec
from advtransfer.models.catalogue import REPLICATE_SEED_STEP, replicate_name, split_checkpoint, split_replicate


def test_replicate_names_round_trip():
    assert replicate_name("resnet20_a", 2) == "resnet20_a@r2"
    assert replicate_name("resnet20_std@epoch2", 1) == "resnet20_std@r1@epoch2"
    assert split_checkpoint("resnet20_std@r1@epoch2") == ("resnet20_std@r1", 2)
    assert split_checkpoint("resnet20_a@r1") == ("resnet20_a@r1", None)
    assert split_replicate("resnet20_a@r1") == ("resnet20_a", 1)
    assert replicate_name("resnet20_a", 0) == "resnet20_a"


def test_replicate_specs_differ_only_in_seed_and_hash():
    base, r1 = get_spec("resnet20_a"), get_spec("resnet20_a@r1")
    assert r1.recipe["seed"] == base.recipe["seed"] + REPLICATE_SEED_STEP
    assert {k: v for k, v in r1.recipe.items() if k != "seed"} == {k: v for k, v in base.recipe.items() if k != "seed"}
    assert r1.recipe_hash("ci") != base.recipe_hash("ci") != get_spec("resnet20_a@r2").recipe_hash("ci")
    # a method continuing from another entry continues from that entry's replicate
    lgv = get_spec("resnet20_lgv@r2")
    assert lgv.resolved_recipe("cpu")["init_from"] == "resnet20_std@r2"
    # an early-stopped checkpoint of a replicate is that replicate's checkpoint
    assert get_spec("resnet20_std@r1@epoch2").kind == "es"
    with pytest.raises(UserError, match="declares 3 replicate"):
        get_spec("resnet20_a@r3")
    with pytest.raises(UserError, match="declares 1 replicate"):
        get_spec("vit_a@r1")


def test_grid_row_runs_over_replicates(tmp_path):
    from advtransfer.grid import expand_cells, load_grid

    grid = {"name": "r", "n": 20, "size": "ci", "eps": ["8/255"], "attacks": {"mifgsm": {}},
            "surrogates": [{"models": ["resnet20_a", "vgg_a"], "name": "ens2", "replicates": 3}, "vit_a"],
            "victims": ["resnet20_b"]}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(grid))
    spec = load_grid(str(tmp_path / "g.yaml"))
    assert [(s.name, s.base, s.replicate, s.models) for s in spec.surrogates] == [
        ("ens2", "ens2", 0, ("resnet20_a", "vgg_a")),
        ("ens2@r1", "ens2", 1, ("resnet20_a@r1", "vgg_a@r1")),
        ("ens2@r2", "ens2", 2, ("resnet20_a@r2", "vgg_a@r2")),
        ("vit_a", "", 0, ("vit_a",))]
    cells = expand_cells(spec, {m: f"sha-{m}" for m in spec.model_names()})
    assert len({c.cell_id for c in cells}) == 4
    grid["surrogates"] = [{"models": ["vit_a"], "replicates": 2}]
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(grid))
    with pytest.raises(UserError, match="replicates: 2"):
        load_grid(str(tmp_path / "g.yaml"))


def test_training_pins_threads_and_the_card_says_so(trained, cache_dir):
    from advtransfer.models import read_card

    before = torch.get_num_threads()
    trained("resnet20_a")
    assert torch.get_num_threads() == before
    card = read_card("resnet20_a", "ci")
    assert card["provenance"]["threads"] == 2 and card["provenance"]["device"] == "cpu"
    assert card["versions"]["torch"] == torch.__version__ and card["sha256"]
