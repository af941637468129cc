"""The model zoo's contracts beyond training quality: no global random side effects, training
method versions in the recipe hash and the card, the card's common keys, and where the shipped
grids and catalogues are found."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from advtransfer.models import zoo
from advtransfer.training import TRAINERS

REPO = Path(__file__).resolve().parent.parent


def _flat(sd: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.flatten().float() for v in sd.values()])


def test_build_and_load_leave_the_global_rng_untouched(trained):
    trained("resnet20_a")  # trained before the measurement (training is checked below)
    spec = zoo.get_spec("resnet20_a")
    torch.manual_seed(1234)
    before = torch.random.get_rng_state()
    a = spec.build()
    assert torch.equal(torch.random.get_rng_state(), before)
    zoo.load_model("resnet20_a", "ci")
    zoo.load_members("resnet20_a", "ci")
    assert torch.equal(torch.random.get_rng_state(), before)
    # the initial weights still come from the recipe's seed, whatever the caller's state
    torch.manual_seed(99)
    b = spec.build()
    assert torch.equal(_flat(a.state_dict()), _flat(b.state_dict()))
    # ... and equal what torch.manual_seed(seed) followed by the plain build gives (the weights
    # every cached model was initialised with before building stopped touching the global RNG)
    from advtransfer.models.archs import build_arch

    torch.manual_seed(int(spec.recipe.get("seed", 0)))
    ref = build_arch(spec.arch, num_classes=spec.num_classes, **spec.arch_kwargs)
    assert torch.equal(_flat(a.net.state_dict()), _flat(ref.state_dict()))


def test_training_is_seeded_inside_and_restores_the_callers_rng():
    from advtransfer.data import load_dataset
    from advtransfer.training import TrainingContext, train_from_recipe

    spec = zoo.get_spec("resnet20_a")
    recipe = {**spec.resolved_recipe("ci"), "epochs": 1, "train_subset": 128, "batch_size": 64}
    data = load_dataset("cifar10", "train")
    states = []
    for caller_seed in (1, 2):
        torch.manual_seed(caller_seed)
        before = torch.random.get_rng_state()
        out = train_from_recipe(spec.build(), recipe, data, TrainingContext(name="t", progress=False))
        assert torch.equal(torch.random.get_rng_state(), before)
        states.append(_flat(out.states[""]))
    # the result depends on the recipe's seed only, not on the caller's random state
    assert torch.equal(states[0], states[1])


def test_every_training_method_has_a_version():
    assert set(TRAINERS.names()) >= {"standard", "fgsm_at", "sam", "lgv", "swag", "csgld"}
    for name in TRAINERS.names():
        v = getattr(TRAINERS.get(name), "VERSION", None)
        assert isinstance(v, int) and v >= 1, name


def test_method_version_enters_recipe_hash_and_card(trained, monkeypatch):
    trained("resnet20_a")
    std, sam = zoo.get_spec("resnet20_std"), zoo.get_spec("resnet20_sam05")
    lgv = zoo.get_spec("resnet20_lgv")  # init_from resnet20_std
    assert std.recipe.get("method", "standard") == "standard" and sam.recipe["method"] == "sam"
    assert lgv.resolved_recipe("ci")["init_from"] == "resnet20_std"
    card = zoo.read_card("resnet20_a", "ci")
    assert card["method_version"] == 1
    h_std, h_sam, h_lgv = (s.recipe_hash("ci") for s in (std, sam, lgv))
    a = zoo.get_spec("resnet20_a")
    assert zoo.is_trained(a, "ci")

    monkeypatch.setattr(TRAINERS.get("standard"), "VERSION", 2)
    assert std.method_version() == 2
    assert std.recipe_hash("ci") != h_std
    assert lgv.recipe_hash("ci") != h_lgv  # its starting point changed
    assert sam.recipe_hash("ci") == h_sam  # another method's models stay valid
    assert not zoo.is_trained(a, "ci")  # models of the old version are stale and retrain

    monkeypatch.setattr(TRAINERS.get("standard"), "VERSION", 1)
    assert std.recipe_hash("ci") == h_std and zoo.is_trained(a, "ci")


def test_card_keys_and_checksum(trained):
    from advtransfer.models.store import zoo_paths
    from advtransfer.core.utils import sha256_file

    trained("resnet20_a")
    card = zoo.read_card("resnet20_a", "ci")
    common = set(zoo.make_card(zoo.get_spec("resnet20_a"), "ci", recipe=None, members=[""], clean_acc=None,
                               clean_acc_images=None, sha256="", device="cpu"))
    assert common <= set(card)
    assert {"method_version", "train_s", "n_params", "surrogate_params", "recipe_hash"} <= common
    weights, card_file = zoo_paths("resnet20_a", "ci")
    assert card["sha256"] == sha256_file(weights) and card_file.is_file()
    assert card["n_params"] == sum(p.numel() for p in zoo.load_model("resnet20_a", "ci").parameters())


def test_checkout_uses_the_top_level_folders(monkeypatch):
    from advtransfer.core import resources
    from advtransfer.grid import resolve_grid_path

    assert resources.source_root() == REPO
    assert resources.grids_dir() == REPO / "grids"
    assert resources.catalogue_dirs() == [REPO / "surrogates", REPO / "victims"]
    assert resources.results_dir() == REPO / "results"
    assert resolve_grid_path("ci") == REPO / "grids" / "ci.yaml"
    monkeypatch.delenv("ADVTRANSFER_ZOO", raising=False)
    assert zoo.zoo_dirs() == resources.catalogue_dirs()


def test_attack_layer_does_not_import_the_model_store():
    import ast

    for path in sorted((REPO / "advtransfer" / "attacks").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                mod = "." * node.level + (node.module or "")
                assert not mod.startswith("..models"), f"{path.name} imports {mod}"
