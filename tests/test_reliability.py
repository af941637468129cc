"""Runs that are interrupted, run twice at once, find corrupt files or a full disk: the table they
end with is the uninterrupted run's, row for row, and nothing is ever half-written.

Every run here is a two-cell grid (ResNet-20 surrogate, I-FGSM and MI-FGSM at 8/255, two victims,
20 test images) on the session's ci-size models, in subprocesses where a process must die.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import REPO, write_grid

VOLATILE = ["craft_s", "eval_s", "created_at", "run_id"]  # wall times and the folder's name


def _cmd(grid: Path, run: Path) -> list[str]:
    return [sys.executable, "-m", "advtransfer", "grid", str(grid), "--out", str(run), "--no-progress", "--no-plot",
            "--no-report"]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or "2", "PYTHONUNBUFFERED": "1",
            **extra}


def _table(run: Path) -> pd.DataFrame:
    df = pd.read_parquet(run / "results.parquet").drop(columns=VOLATILE)
    return df.sort_values(["cell_id", "victim"]).reset_index(drop=True)


def _samples(run: Path) -> pd.DataFrame:
    df = pd.concat([pd.read_parquet(p) for p in sorted((run / "samples").glob("*.parquet"))], ignore_index=True)
    return df.sort_values(["cell_id", "victim", "index"]).reset_index(drop=True)


def _same_as_reference(run: Path, ref: Path) -> None:
    pd.testing.assert_frame_equal(_table(run), _table(ref))
    pd.testing.assert_frame_equal(_samples(run), _samples(ref))
    csv = pd.read_csv(run / "results.csv")
    assert len(csv) == len(_table(ref)) and not csv.duplicated(["cell_id", "victim"]).any()
    assert not [p for p in run.rglob(".*") if p.is_file()], "no temporary file may survive a finished run"


# --- kill -9 ---------------------------------------------------------------------------------------

KILL_POINTS = ["trained", "adv_saved", "samples_written", "shard_written", "adv_saved", "merge"]


def test_kill_9_at_every_stage_then_rerun_gives_the_uninterrupted_table(tiny):
    """SIGKILL (no cleanup at all) at six points in a row, each rerun picking up where the last
    died: before anything is written, after a cell's examples, after its per-image table, after
    its rows, after the second cell's examples, and between results.parquet and results.csv."""
    run = tiny["tmp"] / "killed"
    for point in KILL_POINTS:
        proc = subprocess.run(_cmd(tiny["grid"], run), cwd=REPO, env=_env(ADVTRANSFER_KILL_AT=point),
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == -signal.SIGKILL, f"{point}: {proc.returncode}\n{proc.stderr[-2000:]}"
    assert len(list((run / "shards").glob("*.parquet"))) == 2  # both cells finished across the kills
    proc = subprocess.run(_cmd(tiny["grid"], run), cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "crafting" not in proc.stdout, "every cell was finished before the last kill: nothing is re-crafted"
    _same_as_reference(run, tiny["ref"])
    log = (run / "run.log").read_text()
    assert log.count("run started") == len(KILL_POINTS) + 1 and log.rstrip().endswith("run finished")


def test_sigterm_abandons_the_cell_says_how_to_resume(tiny):
    grid = write_grid(tiny["tmp"] / "term.yaml", surrogates=["resnet20_a"], victims=["resnet20_b", "vgg_a"],
                      attacks={"ifgsm": {}, "mifgsm": {}}, eps=["8/255"], n=200)
    run = tiny["tmp"] / "term"
    proc = subprocess.Popen(_cmd(grid, run), cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    for line in proc.stdout:  # the first cell has started crafting
        if line.startswith("crafting"):
            break
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=600)
    assert proc.returncode == 143, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[-1].startswith("advtransfer: SIGTERM:") and "resume with: advtransfer grid" in lines[-1]
    assert not [p for p in run.rglob(".*") if p.is_file()]
    assert "run interrupted" in (run / "run.log").read_text()
    # the manifest says the run did not finish (what the claims' records export checks)
    assert json.loads((run / "manifest.json").read_text())["finished_at"] is None
    again = subprocess.run(_cmd(grid, run), cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    df = pd.read_parquet(run / "results.parquet")
    assert len(df) == 2 * 2 and not df.duplicated(["cell_id", "victim"]).any()
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["finished_at"] and sorted(manifest["finished_cells"]) == sorted(set(df["cell_id"]))


# --- two runs on one folder ------------------------------------------------------------------------

def test_second_run_stops_at_once_naming_the_holder_and_a_killed_holder_does_not_block(tiny):
    from advtransfer.cli import main

    run = tiny["tmp"] / "locked"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom advtransfer.core.lock import RunLock\n"
                               "lock = RunLock(sys.argv[1], 'advtransfer grid (holder)').__enter__()\nprint('held', flush=True)\n"
                               "time.sleep(600)\n", str(run)], cwd=REPO, env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        import contextlib
        import io

        err = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(["grid", str(tiny["grid"]), "--out", str(run), "--no-progress", "--no-plot", "--no-report"])
        assert rc == 2 and time.perf_counter() - t0 < 60
        line = err.getvalue().strip()
        assert "\n" not in line and f"in use by pid {holder.pid}" in line and "holder" in line, line
        assert not (run / "results.parquet").exists() and not (run / "shards").exists()
    finally:
        holder.kill()  # SIGKILL: the lock file and a stale lock.json stay behind
        holder.wait()
    assert (run / "lock.json").exists()
    from advtransfer.grid import load_grid
    from advtransfer.run.context import RunContext
    from advtransfer.run.runner import run_grid

    run_grid(load_grid(str(tiny["grid"])), RunContext(run, progress=False), log=lambda _m: None)  # takes the stale lock
    _same_as_reference(run, tiny["ref"])
    assert not (run / "lock.json").exists()


def test_a_second_command_in_the_holders_first_instant_still_names_it(tmp_path):
    """The holder takes the OS lock, then writes lock.json: a second command that arrives in
    between waits for the name instead of printing an unnamed holder (CI saw that race)."""
    from advtransfer.core.errors import UserError
    from advtransfer.core.lock import RunLock

    run = tmp_path / "race"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom filelock import FileLock\n"
                               "import advtransfer.core.lock as L\n"
                               "lk = FileLock(sys.argv[1] + '/' + L.LOCK_FILE, timeout=0); lk.acquire()\n"
                               "print('locked', flush=True); time.sleep(0.5)\n"
                               "import json, os\nopen(sys.argv[1] + '/' + L.HOLDER_FILE, 'w').write(json.dumps("
                               "{'pid': os.getpid(), 'host': 'h', 'started': 's', 'command': 'late writer'}))\n"
                               "time.sleep(600)\n", str(run)], cwd=REPO, env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(UserError, match=f"in use by pid {holder.pid} .*late writer"):
            with RunLock(run):
                pass
    finally:
        holder.kill()
        holder.wait()


def test_two_grid_runs_at_once_never_double_a_row(tiny):
    run = tiny["tmp"] / "twice"
    procs = [subprocess.Popen(_cmd(tiny["grid"], run), cwd=REPO, env=_env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes in ([0, 0], [0, 2]), results
    for rc, err in results:
        if rc == 2:
            # the loser names the holder's pid, or (if the holder is slower than 2 s to write
            # lock.json under load) says it is not named yet: either way one line
            assert "is in use by" in err and len(err.strip().splitlines()) == 1, err
    _same_as_reference(run, tiny["ref"])


# --- corrupt files ---------------------------------------------------------------------------------

def _flip(path: Path, where: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * where)] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupt_cached_files_are_reported_and_rebuilt_never_used(tiny):
    run = tiny["tmp"] / "corrupt"
    shutil.copytree(tiny["ref"], run)
    cells = sorted(p.stem for p in (run / "adv").glob("*.safetensors"))
    _flip(run / "adv" / f"{cells[0]}.safetensors")                      # bit rot in the examples
    shard = run / "shards" / f"{cells[1]}.parquet"
    shard.write_bytes(shard.read_bytes()[: len(shard.read_bytes()) // 2])  # a truncated copy
    _flip(run / "samples" / f"{cells[1]}.parquet", 0.3)                  # and a damaged per-image table
    proc = subprocess.run(_cmd(tiny["grid"], run), cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [ln for ln in proc.stderr.splitlines() if "is corrupt" in ln]
    assert len(warnings) == 3, proc.stderr
    assert any(f"{cells[0]}.safetensors" in w and "re-crafting" in w for w in warnings)
    assert proc.stdout.count("crafting") == 1, "only the cell whose examples were damaged is re-crafted"
    _same_as_reference(run, tiny["ref"])


def test_analyses_refuse_a_corrupt_per_image_table(tiny):
    from advtransfer.cli import main

    run = tiny["tmp"] / "corrupt-analysis"
    shutil.copytree(tiny["ref"], run)
    _flip(next((run / "samples").glob("*.parquet")), 0.4)
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["compare", str(run), "--a", "mifgsm", "--b", "ifgsm"])
    assert rc == 2 and "does not match its checksum" in err.getvalue(), err.getvalue()


def test_checksums_tell_good_from_damaged_files(tmp_path):
    from advtransfer.core.utils import atomic_path, checksum_matches

    p = tmp_path / "t.bin"
    with atomic_path(p, checksum=True) as tmp:
        tmp.write_bytes(b"x" * 1000)
    assert checksum_matches(p) is True
    _flip(p)
    assert checksum_matches(p) is False
    (tmp_path / "legacy.bin").write_bytes(b"y")
    assert checksum_matches(tmp_path / "legacy.bin") is None


# --- a full disk -----------------------------------------------------------------------------------

def test_disk_full_is_one_line_and_nothing_half_written(tiny, monkeypatch):
    """ENOSPC from the parquet writer after it wrote part of a file (what a full disk does)."""
    import errno

    from advtransfer.cli import main

    real = pd.DataFrame.to_parquet

    def full(self, path, *a, **kw):
        Path(path).write_bytes(b"PAR1" + b"\0" * 4096)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", full)
    run = tiny["tmp"] / "full"
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["grid", str(tiny["grid"]), "--out", str(run), "--no-progress", "--no-plot", "--no-report"])
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "disk full while writing" in lines[0] and "MiB" in lines[0], lines
    assert not [p for p in run.rglob("*.parquet")] and not [p for p in run.rglob(".*") if p.is_file()]
    monkeypatch.setattr(pd.DataFrame, "to_parquet", real)
    rc = main(["grid", str(tiny["grid"]), "--out", str(run), "--no-progress", "--no-plot", "--no-report"])
    assert rc == 0  # space freed: the rerun resumes from the cached examples
    _same_as_reference(run, tiny["ref"])


# --- dry run ---------------------------------------------------------------------------------------

def test_dry_run_lists_cells_and_writes_nothing(tiny, capsys):
    from advtransfer.cli import main

    run = tiny["tmp"] / "dry"
    shutil.copytree(tiny["ref"], run)
    grid = write_grid(tiny["tmp"] / "dry.yaml", **{**yaml.safe_load(tiny["grid"].read_text()),
                                                   "victims": ["resnet20_b", "vgg_a", "vgg_b"]})
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    assert main(["grid", str(grid), "--out", str(run), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before
    rows = [ln for ln in out.splitlines() if " resnet20_a " in ln]
    assert len(rows) == 2 and all(" cached " in r for r in rows)
    assert all(r.split()[-3] == "1" and r.split()[-2] == "0" and r.split()[-1] == "20" for r in rows), rows
    assert "2 cells, 2 with work to do" in out


def test_processes_sharing_a_cache_train_a_model_once(tmp_path, monkeypatch, request):
    """Two commands sharing a cache (two grids, parallel test workers, array jobs) must not both
    train a missing model: the second waits on the entry's training lock, says so once, and then
    finds the model trained. Deterministic: this process holds the lock while a `zoo train`
    subprocess reaches it, trains the model itself, then lets go."""
    from advtransfer.models.sources import ensure_trained, train_lock

    from test_distortion_e2e import ZOO

    (tmp_path / "zoo").mkdir()
    (tmp_path / "zoo" / "tiny.yaml").write_text(ZOO)
    monkeypatch.setenv("ADVTRANSFER_ZOO", str(tmp_path / "zoo"))
    cache = tmp_path / "cache"
    with train_lock("tiny_a", "ci", cache):
        proc = subprocess.Popen([sys.executable, "-m", "advtransfer", "zoo", "train", "tiny_a", "--size", "ci",
                                 "--cache-dir", str(cache), "--no-progress"], cwd=REPO, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
        import select

        request.addfinalizer(lambda: proc.poll() is None and proc.kill())
        seen, deadline = "", time.monotonic() + 120
        while "another process is preparing it" not in seen and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 1.0)[0]:
                line = proc.stdout.readline()
                if not line:  # it ended without waiting
                    break
                seen += line
        assert "tiny_a: another process is preparing it in this cache" in seen, seen
        assert proc.poll() is None  # still waiting
        card = ensure_trained(["tiny_a"], "ci", cache, progress=False, log=lambda *_: None)[0]  # re-entrant
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "training tiny_a" not in out  # it found the model trained: one training, not two
    assert json.loads((cache / "zoo" / "ci" / "tiny_a.json").read_text())["sha256"] == card["sha256"]
