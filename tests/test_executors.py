"""Executors (serial, local worker processes, submitit's local executor): the same grid gives the
same table whichever runs the cells, and a cell that fails on a worker is reported and retried.

The grid is small (two ci surrogates, two attacks, 40 test images, 5 steps) so that the cost is
the workers' start-up. The serial reference runs with 1 torch thread, like each of the two workers
(float summation order depends on the thread count), so the adversarial examples must agree bit
for bit, not only the counts.
"""
from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from advtransfer.core.utils import temp_env

GRID = {"name": "exec", "n": 40, "size": "ci", "batch_size": 40, "eps": ["8/255"], "defaults": {"steps": 5},
        "attacks": {"ifgsm": {}, "mifgsm": {}}, "surrogates": ["resnet20_a", "vgg_a"],
        "victims": ["resnet20_a", "vgg_a", "resnet20_b"]}
KEY = ["cell_id", "victim"]


@pytest.fixture(scope="module")
def grid_file(tmp_path_factory, trained) -> Path:
    for m in ("resnet20_a", "vgg_a", "resnet20_b"):  # the ci zoo, trained once per session
        trained(m)
    path = tmp_path_factory.mktemp("exec") / "exec.yaml"
    path.write_text(yaml.safe_dump(GRID))
    return path


def _grid(*args: str) -> tuple[int, str]:
    from advtransfer.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["grid", *args, "--no-progress", "--no-plot", "--no-report"])
    return rc, err.getvalue()


def _table(run: Path) -> pd.DataFrame:
    return pd.read_parquet(run / "results.parquet").sort_values(KEY).reset_index(drop=True)


def _samples(run: Path) -> pd.DataFrame:
    df = pd.concat([pd.read_parquet(p) for p in sorted((run / "samples").glob("*.parquet"))])
    return df.sort_values(["cell_id", "victim", "index"]).reset_index(drop=True)


def _x_adv(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {p.stem: load_file(str(p))["x_adv"] for p in (run / "adv").glob("*.safetensors")}


def test_serial_local_and_submitit_give_the_same_table(grid_file, tmp_path):
    pytest.importorskip("submitit")
    runs = {k: tmp_path / k for k in ("serial", "local", "submitit")}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what each of two workers gets on two cores (the float order matters)
    try:
        assert _grid(str(grid_file), "--out", str(runs["serial"]))[0] == 0
    finally:
        torch.set_num_threads(threads)
    with temp_env(OMP_NUM_THREADS=2):  # two cores to split between two workers, whatever the machine has
        torch.set_num_threads(2)
        try:
            rc, err = _grid(str(grid_file), "--out", str(runs["local"]), "--executor", "local", "--workers", "2")
            assert rc == 0, err
            (tmp_path / "profile.yaml").write_text("cluster: local\ntimeout_min: 20\n")
            rc, err = _grid(str(grid_file), "--out", str(runs["submitit"]), "--executor", "submitit",
                            "--profile", str(tmp_path / "profile.yaml"), "--workers", "2")
            assert rc == 0, err
        finally:
            torch.set_num_threads(threads)
    ref = _table(runs["serial"])
    assert len(ref) == 12 and not ref.duplicated(KEY).any()
    counts = ["cell_id", "victim", "n_clean_correct", "n_success", "n_transfer_success", "grad_evals", "asr"]
    for k in ("local", "submitit"):
        t = _table(runs[k])
        assert not t.duplicated(KEY).any(), f"{k}: a (cell, victim) row twice"
        pd.testing.assert_frame_equal(t[counts], ref[counts], obj=f"{k} vs serial")
        pd.testing.assert_frame_equal(_samples(runs[k]), _samples(runs["serial"]), obj=f"{k} per-image rows")
        xa, xs = _x_adv(runs[k]), _x_adv(runs["serial"])
        assert xa.keys() == xs.keys() and all(torch.equal(xa[c], xs[c]) for c in xs), f"{k}: examples differ"
    # the local run's log names its workers; submitit kept its job files in the run folder
    assert "local executor: 2 worker processes" in (runs["local"] / "run.log").read_text()
    assert list((runs["submitit"] / "submitit").glob("*_result.pkl"))


def test_a_failing_cell_is_reported_retried_and_listed(grid_file, tmp_path):
    from advtransfer.grid import expand_cells, load_grid
    from advtransfer.models import zoo

    spec = load_grid(str(grid_file), "ifgsm")
    shas = {m: zoo.read_card(m, "ci")["sha256"] for m in spec.model_names()}
    bad, good = (c.cell_id for c in expand_cells(spec, shas))

    def args(run: Path) -> tuple[str, ...]:
        return (str(grid_file), "--attack", "ifgsm", "--out", str(run), "--executor", "local", "--workers", "2")

    run = tmp_path / "run"

    # fails on its first try only: the retry finishes it, the run succeeds
    with temp_env(ADVTRANSFER_FAIL_AT=f"cell:{bad}", ADVTRANSFER_FAIL_ONCE=tmp_path / "once"):
        rc, err = _grid(*args(run))
    assert rc == 0, err
    log = (run / "run.log").read_text()
    assert f"cell {bad} failed (attempt): InjectedFault" in log and "retrying 1 failed cell once" in log
    assert "Traceback" in log  # the worker's traceback is kept for whoever debugs it
    assert len(_table(run)) == 6

    # fails every time: listed with its error, exit 1, the other cell's rows are in the table
    run2 = tmp_path / "run2"
    with temp_env(ADVTRANSFER_FAIL_AT=f"cell:{bad}"):
        rc, err = _grid(*args(run2))
    assert rc == 1
    assert "1 of 2 cells failed twice" in err and f"cell {bad}: InjectedFault" in err
    t = _table(run2)
    assert set(t["cell_id"]) == {good} and len(t) == 3
    # the fault gone, a rerun finishes the missing cell only (the finished one is not re-crafted)
    before = (run2 / "adv" / f"{good}.safetensors").stat().st_mtime_ns
    assert _grid(*args(run2))[0] == 0
    assert len(_table(run2)) == 6 and (run2 / "adv" / f"{good}.safetensors").stat().st_mtime_ns == before


def test_a_worker_that_dies_is_replaced_and_its_cells_retried(grid_file, tmp_path):
    """A worker killed outright (SIGKILL after saving a cell's examples: out of memory, a node
    lost) breaks the pool; every unfinished cell is retried in a fresh pool and the table ends
    complete, with the killed cell's saved examples reused."""
    run = tmp_path / "run"
    with temp_env(ADVTRANSFER_KILL_AT="adv_saved", ADVTRANSFER_KILL_ONCE=tmp_path / "once"):
        rc, err = _grid(str(grid_file), "--out", str(run), "--executor", "local", "--workers", "2")
    assert rc == 0, err
    assert (tmp_path / "once").exists(), "the fault was never injected"
    log = (run / "run.log").read_text()
    assert "worker process died" in log and "retrying" in log
    t = _table(run)
    assert len(t) == 12 and not t.duplicated(KEY).any()
