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
#: the public keyword API (users call them with cache= and data_dir=); each makes a RunContext
ENTRY_POINTS = {"runner.py:run_grid", "runner.py:plan_grid"}


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
    """Only the public keyword entry points take ``cache`` and ``data_dir``; below them, the context."""
    found = set()
    for path in sorted(RUN.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                if {"cache", "data_dir"} <= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}:
                    found.add(f"{path.name}:{node.name}")
    extra = sorted(found - ENTRY_POINTS)
    assert not extra, f"run-layer functions taking cache and data_dir (take a RunContext instead): {extra}"
    assert found == ENTRY_POINTS, f"an entry point moved: update ENTRY_POINTS ({sorted(ENTRY_POINTS - found)})"
