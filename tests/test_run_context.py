"""The run context (issue 56): one frozen value carries a run's folder, model cache, data folder,
device, threads, progress flag and submitit profile, so the run layer's functions take it instead
of handing ``cache`` and ``data_dir`` along one by one."""
from __future__ import annotations

import ast
import dataclasses
import pickle
from pathlib import Path

import pytest

from advtransfer.run.context import RunContext

RUN = Path(__file__).resolve().parent.parent / "advtransfer" / "run"


def test_a_context_is_frozen_and_travels_to_worker_processes(tmp_path):
    ctx = RunContext(str(tmp_path / "run"), cache=tmp_path / "cache", data_dir="data", device="cpu", profile="p.yaml")
    assert ctx.run_dir == tmp_path / "run" and isinstance(ctx.run_dir, Path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.device = "cuda"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(ctx)) == ctx  # spawn workers and submitit tasks receive it pickled
    worker = ctx.for_worker("cuda:1", 4)
    assert (worker.device, worker.threads, worker.progress) == ("cuda:1", 4, False)
    assert dataclasses.replace(worker, device="cpu", threads=None, progress=True) == ctx


def test_the_run_layer_passes_the_context_not_cache_and_data_dir():
    """No function of the run layer takes ``cache`` and ``data_dir`` (the public entry points
    included: they take a RunContext, or a run folder that stands for one)."""
    found = set()
    for path in sorted(RUN.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
                if {"cache", "data_dir"} <= names or {"cache_dir", "data_dir"} <= names:
                    found.add(f"{path.name}:{node.name}")
    assert not found, f"run-layer functions taking cache and data_dir (take a RunContext instead): {sorted(found)}"


def test_a_run_folder_stands_for_a_default_context(tmp_path):
    from advtransfer.grid import load_grid
    from advtransfer.run.runner import context_for, default_run_dir

    spec = load_grid("ci")
    ctx = RunContext(tmp_path / "run", cache=tmp_path / "cache", progress=False)
    assert context_for(spec, ctx) is ctx
    assert context_for(spec, str(tmp_path / "r")) == RunContext(tmp_path / "r")
    assert context_for(spec, None).run_dir == default_run_dir(spec)
