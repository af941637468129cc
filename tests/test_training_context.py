"""The training context (advtransfer.training.context): the run-time facts of a training run
travel beside the recipe, never inside it, so the recipe a trainer sees is the hashed one."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from advtransfer.training import TRAINERS, TrainingContext, train_from_recipe


def test_the_context_is_a_read_only_value():
    ctx = TrainingContext(name="m", resume="x/m.pt", sources={"a": torch.nn.Identity()})
    assert ctx.resume == Path("x/m.pt") and list(ctx.sources) == ["a"]
    with pytest.raises(AttributeError):
        ctx.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        ctx.sources["b"] = torch.nn.Identity()  # type: ignore[index]
    assert TrainingContext().resume is None and not TrainingContext().sources


def test_run_time_state_in_the_recipe_or_a_bare_device_is_refused():
    """The former private recipe keys (_name, _resume, _sources) and the former positional device
    fail loudly instead of being silently ignored (a resume file never written)."""
    with pytest.raises(TypeError, match="recipe keys"):
        train_from_recipe(torch.nn.Linear(1, 1), {"_resume": "r.pt", "epochs": 1}, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="TrainingContext"):
        train_from_recipe(torch.nn.Linear(1, 1), {"epochs": 1}, None, "cpu")  # type: ignore[arg-type]


def test_every_registered_trainer_takes_the_context():
    import inspect

    for name in TRAINERS.names():
        if TRAINERS.code(name):  # a plugin's, registered by another test
            continue
        params = list(inspect.signature(TRAINERS.get(name)).parameters)
        assert params == ["net", "recipe", "data", "ctx"], (name, params)
