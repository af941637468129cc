"""``advtransfer pack``: a run folder without its adversarial examples resumes elsewhere. A finished
run's pack reruns without crafting and keeps its table; an interrupted run's pack, copied to a new
folder, crafts only the unfinished cell and ends with the uninterrupted run's table, row for row;
a packed cell asked for a new victim is crafted again; bad input is one line and writes nothing.

Every run is a two-cell grid (ResNet-20 surrogate, I-FGSM and MI-FGSM at 8/255, two victims, 20
test images) on the session's ci-size models, as in tests/test_reliability.py.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pandas as pd

from conftest import REPO, cli, write_grid
from test_reliability import _cmd, _env, _same_as_reference, _samples, _table


def _grid(grid, run, *extra: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(_cmd(grid, run) + list(extra), cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_a_finished_runs_pack_reruns_without_crafting_and_keeps_its_table(tiny):
    dest = tiny["tmp"] / "packed-finished"
    out = cli("pack", str(tiny["ref"]), str(dest))
    assert "2 cell(s) (2 new)" in out.stdout and "finished run" in out.stdout
    assert not list(dest.rglob("*.safetensors")), "a pack holds no adversarial examples"
    markers = sorted(p.stem for p in (dest / "adv").glob("*.packed"))
    assert markers == sorted(p.stem for p in (tiny["ref"] / "adv").glob("*.safetensors"))
    for m in markers:  # each marker names the examples it stands for
        rec = json.loads((dest / "adv" / f"{m}.packed").read_text())
        assert rec["examples"] == f"{m}.safetensors" and len(rec["sha256"]) == 64
    assert json.loads((dest / "manifest.json").read_text())["finished_at"]
    # a pack is copied and committed: it names no folder of the machine that ran it
    for f in ("manifest.json", "run.log"):
        assert str(tiny["tmp"]) not in (dest / f).read_text(), f
    pd.testing.assert_frame_equal(_table(dest), _table(tiny["ref"]))
    # nearly all of a run's size is its examples: the pack is a fraction of it
    size = lambda d: sum(f.stat().st_size for f in d.rglob("*") if f.is_file())  # noqa: E731
    assert size(dest) < size(tiny["ref"])
    again = _grid(tiny["grid"], dest)
    assert "crafting" not in again.stdout, "packed cells are done: nothing is crafted"
    _same_as_reference(dest, tiny["ref"])


def test_an_interrupted_runs_pack_resumes_elsewhere_and_ends_with_the_uninterrupted_table(tiny):
    run = tiny["tmp"] / "interrupted"
    proc = subprocess.run(_cmd(tiny["grid"], run), cwd=REPO, env=_env(ADVTRANSFER_KILL_AT="shard_written"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0  # killed after the first cell's rows were written
    assert len(list((run / "shards").glob("*.parquet"))) == 1
    first = tiny["tmp"] / "sitting-1"
    out = cli("pack", str(run), str(first))
    assert "1 cell(s) (1 new)" in out.stdout and "1 cell(s) still to run" in out.stdout
    assert json.loads((first / "manifest.json").read_text())["finished_at"] is None
    # another machine: a copy of the pack (what a commit carries), then the same command
    elsewhere = tiny["tmp"] / "elsewhere"
    shutil.copytree(first, elsewhere)
    resumed = _grid(tiny["grid"], elsewhere)
    assert resumed.stdout.count("crafting") == 1, "only the unfinished cell is crafted"
    _same_as_reference(elsewhere, tiny["ref"])
    # the second sitting packed into the first sitting's pack: the pack is now the finished run
    out = cli("pack", str(elsewhere), str(first))
    assert "2 cell(s) (1 new)" in out.stdout and "finished run" in out.stdout
    pd.testing.assert_frame_equal(_table(first), _table(tiny["ref"]))
    pd.testing.assert_frame_equal(_samples(first), _samples(tiny["ref"]))
    log = (first / "run.log").read_text()
    assert log.count("run started") == 2, "each sitting's log once"
    packs = json.loads((first / "manifest.json").read_text())["packed"]
    assert [p["cells"] for p in packs] == [1, 2] and [p["finished"] for p in packs] == [False, True]


def test_a_packed_cell_asked_for_a_new_victim_is_crafted_again(tiny):
    dest = tiny["tmp"] / "packed-new-victim"
    cli("pack", str(tiny["ref"]), str(dest))
    grid = write_grid(tiny["tmp"] / "more.yaml", surrogates=["resnet20_a"], victims=["resnet20_b", "vgg_a", "resnet20_a"],
                      attacks={"ifgsm": {}, "mifgsm": {}}, eps=["8/255"], n=20)
    plan = cli("grid", str(grid), "--out", str(dest), "--dry-run").stdout
    assert "2 cells, 2 with work to do" in plan and " packed " not in plan, "a packed cell without the new victim is to craft"
    proc = _grid(grid, dest)
    assert proc.stdout.count("crafting") == 2, "both packed cells lack the new victim: both are crafted again"
    assert len(list((dest / "adv").glob("*.safetensors"))) == 2 and not list((dest / "adv").glob("*.packed"))
    df = _table(dest)
    assert set(df["victim"]) == {"resnet20_b", "vgg_a", "resnet20_a"}
    # the re-crafted examples are the packed ones again (crafting is deterministic): the old victims' rows match
    old = df[df["victim"] != "resnet20_a"].reset_index(drop=True)
    pd.testing.assert_frame_equal(old.drop(columns=["is_whitebox"], errors="ignore"),
                                  _table(tiny["ref"]).drop(columns=["is_whitebox"], errors="ignore"), check_like=True)


def test_dry_run_counts_packed_cells_as_done(tiny):
    dest = tiny["tmp"] / "packed-plan"
    cli("pack", str(tiny["ref"]), str(dest))
    plan = cli("grid", str(tiny["grid"]), "--out", str(dest), "--dry-run").stdout
    assert plan.count(" packed ") == 2 and "2 cells, 0 with work to do: 0 surrogate" in plan


def test_bad_pack_input_is_one_line_and_writes_nothing(tiny, tmp_path):
    def fails(*args: str) -> str:
        proc = cli("pack", *args, check=False)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("advtransfer: error:"), proc.stderr
        return lines[0]

    assert "not a run folder" in fails(str(tmp_path / "nothing"), str(tmp_path / "p1"))
    assert not (tmp_path / "p1").exists()
    assert "outside the run folder" in fails(str(tiny["ref"]), str(tiny["ref"] / "pack"))
    assert not (tiny["ref"] / "pack").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert "holds files but no run" in fails(str(tiny["ref"]), str(other))
    # a pack of another grid (other eps): refused, the pack untouched
    grid16 = write_grid(tmp_path / "g16.yaml", surrogates=["resnet20_a"], victims=["resnet20_b", "vgg_a"],
                        attacks={"ifgsm": {}}, eps=["16/255"], n=20)
    run16 = tmp_path / "run16"
    _grid(grid16, run16)
    first = tmp_path / "pack-of-ref"
    cli("pack", str(tiny["ref"]), str(first))
    before = {p: p.read_bytes() for p in first.rglob("*") if p.is_file() and p.name not in ("run.lock", "lock.json")}
    assert "pack of another run" in fails(str(run16), str(first))
    after = {p: p.read_bytes() for p in first.rglob("*") if p.is_file() and p.name not in ("run.lock", "lock.json")}
    assert after == before
    # a run folder with examples is not a pack to add to
    copy = tmp_path / "ref-copy"
    shutil.copytree(tiny["ref"], copy)
    assert "not a pack" in fails(str(tiny["ref"]), str(copy))



def test_claims_runs_in_two_sittings_through_make(tiny, tmp_path):
    """The Makefile's sittings: make claims-runs killed after its first cell, make claims-pack packs
    the unfinished run into PARTIAL, a fresh clone's make claims-runs (no run folder) resumes from
    the pack and crafts only the other cell, and make claims-pack then removes the finished run's pack."""
    import os

    claims = tmp_path / "claims.yaml"
    claims.write_text(f"name: sittings\nsizes: [ci]\nclaims:\n"
                      f"  - {{id: mi, claim: MI-FGSM beats I-FGSM, paper: test, setting: tiny, grid: {tiny['grid']},\n"
                      f"     by: attack, a: mifgsm, b: ifgsm, eps: 8/255}}\n")
    bindir = os.path.dirname(sys.executable)
    stamp = REPO / ".venv" / ".installed"
    runs, partial = tmp_path / "runs", tmp_path / "partial"

    def make(target: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(["make", "--no-print-directory", "-o", str(stamp), target, "SIZE=ci", f"BIN={bindir}",
                               f"CLAIMS={claims}", f"CLAIMS_RUNS={runs}", f"PARTIAL={partial}", "CLAIMS_N=20"],
                              cwd=REPO, env=_env(**env), capture_output=True, text=True, timeout=600)

    first = make("claims-runs", ADVTRANSFER_KILL_AT="shard_written")
    assert first.returncode != 0 and "did not finish" in first.stdout
    packed = make("claims-pack")
    assert packed.returncode == 0, packed.stderr
    pack = partial / "ci" / "ci"  # <size>/<the grid's name>
    assert (pack / "manifest.json").is_file() and len(list((pack / "adv").glob("*.packed"))) == 1
    shutil.rmtree(runs)  # a fresh clone: the pack (committed) is all that is left of the first sitting
    second = make("claims-runs")
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert "resuming from the pack" in second.stdout and second.stdout.count("crafting") == 1
    _same_as_reference(runs / "ci" / "ci", tiny["ref"])
    done = make("claims-pack")
    assert done.returncode == 0 and not pack.exists() and "has finished" in done.stdout
