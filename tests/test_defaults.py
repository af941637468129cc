"""One default zoo size everywhere: the Python API, every command and a grid without ``size:``
take the shipped converged zoo (nothing trains); ``--size cpu`` is the explicit choice that trains.
The suite itself runs with ADVTRANSFER_SIZE=ci (tests/conftest.py), so these tests clear it."""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parent.parent


def _size_options(parser: argparse.ArgumentParser, path: str = "advtransfer"):
    """(command path, the --size action) of every subcommand that takes one."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _size_options(sub, f"{path} {name}")
        elif "--size" in action.option_strings:
            yield path, action


def test_one_default_size_for_api_commands_and_grids(monkeypatch, tmp_path):
    monkeypatch.delenv("ADVTRANSFER_SIZE", raising=False)
    from advtransfer.cli import build_parser
    from advtransfer.core.config import DEFAULT_SIZE, default_size, zoo_size
    from advtransfer.grid import load_grid

    assert DEFAULT_SIZE == "converged" == default_size() == zoo_size(None)
    # every command's --size is unset by default and resolved by zoo_size, never a size of its own
    options = list(_size_options(build_parser()))
    assert len(options) >= 6, options
    # (grid's flag overrides the grid file's size, claims' filters a listing: neither has a default)
    for path, action in options:
        assert action.default is None, f"{path} --size defaults to {action.default!r}"
        if path.split()[-1] not in ("grid", "claims"):
            assert "converged" in (action.help or ""), f"{path} --size help does not name the default: {action.help}"
    # a grid without size: takes the default
    g = yaml.safe_load((REPO / "grids" / "ci.yaml").read_text())
    g.pop("size")
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(g))
    assert load_grid(str(tmp_path / "g.yaml")).size == "converged"
    # the environment still chooses, for every one of them alike
    monkeypatch.setenv("ADVTRANSFER_SIZE", "cpu")
    assert default_size() == zoo_size(None) == load_grid(str(tmp_path / "g.yaml")).size == "cpu"


def test_load_model_without_size_is_the_shipped_converged_model(monkeypatch):
    """``advtransfer.load_model(name)`` loads the shipped, checksum-verified converged weights:
    the trainer is never called."""
    import advtransfer
    from advtransfer.models import zoo

    def no_training(*_a, **_k):
        raise AssertionError("load_model trained a model")

    monkeypatch.delenv("ADVTRANSFER_SIZE", raising=False)
    monkeypatch.setattr(zoo, "ensure_trained", no_training)
    default = advtransfer.load_model("resnet20_b")
    converged = advtransfer.load_model("resnet20_b", size="converged")
    a, b = default.state_dict(), converged.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
