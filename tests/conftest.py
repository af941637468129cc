"""Shared fixtures. Tests train `ci`-size zoo models on real CIFAR-10 into a temporary cache
(never the user's cache), so a warm cache can never hide a failure on a fresh machine."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


def _data_dir() -> str | None:
    env = os.environ.get("ADVTRANSFER_DATA")
    if env:
        return env
    cand = REPO.parent / "shared" / "data" / "cifar10"
    return str(cand) if (cand / "test.npz").is_file() else None


@pytest.fixture(scope="session", autouse=True)
def _env(tmp_path_factory: pytest.TempPathFactory):
    """Point the harness at a fresh temporary cache and at the offline CIFAR-10 copy."""
    data = _data_dir()
    if data is None:
        pytest.exit("CIFAR-10 npz folder not found: set ADVTRANSFER_DATA or place ../shared/data/cifar10", 2)
    cache = tmp_path_factory.mktemp("advtransfer-cache")
    old = {k: os.environ.get(k) for k in ("ADVTRANSFER_CACHE", "ADVTRANSFER_DATA", "ADVTRANSFER_SIZE", "HF_HUB_OFFLINE")}
    os.environ.update(ADVTRANSFER_CACHE=str(cache), ADVTRANSFER_DATA=data, ADVTRANSFER_SIZE="ci", HF_HUB_OFFLINE="1")
    threads = int(os.environ.get("OMP_NUM_THREADS") or min(2, os.cpu_count() or 1))
    torch.set_num_threads(max(1, threads))
    yield cache
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def cache_dir(_env) -> Path:
    return _env


@pytest.fixture(scope="session")
def test_data():
    """Test images 0..199 (bit-exact originals): x float N×3×32×32 in [0,1], y, index."""
    from advtransfer.data import eval_subset, load_cifar10

    return eval_subset(load_cifar10("test"), 200)


@pytest.fixture(scope="session")
def trained(cache_dir):
    """Train (once per session) and load ci-size zoo models by name."""
    from advtransfer.models import zoo

    loaded: dict[str, torch.nn.Module] = {}

    def get(name: str) -> torch.nn.Module:
        if name not in loaded:
            zoo.ensure_trained([name], "ci", progress=False, log=lambda *_: None)
            loaded[name] = zoo.load_model(name, "ci")
        return loaded[name]

    return get


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # A run that collects no test is a failure, not pytest's "no tests" exit 5.
    if session.testscollected == 0:
        session.exitstatus = 1
