"""Golden regression check: the ci grid, run end to end through the CLI on real CIFAR-10, must
reproduce the committed per-image counts in results/baselines/ci/; a planted change (I-FGSM's step
size +10%) must be caught and named.

The models: the session's ci models (trained into the test cache) when they are bit-identical to
the baseline's, else the baseline's own copies (results/baselines/ci/zoo/, used as the shipped
zoo): another machine kind trains other weights, and a retrained model is another sample whose
transfer differs by more than any regression tolerance (measured: one CI machine's retrained ci zoo
moved 22 of 60 rows by up to 17.7 points with unchanged code). With the baseline's weights the
check is bit for bit where this machine's kernels round as the baseline's (its kernel probe), and
statistical (boundary flips only) where they do not.

Refreshing the baseline (when a change of the numbers is intended): ``make golden-update``, which
runs this module with ADVTRANSFER_GOLDEN_UPDATE=1 so the baseline is made exactly the way the
check reruns it (same code path, same torch thread count), its models copied beside it. The thread
count is pinned to the baseline's (2, what CI uses): training with 1 and 2 threads gives different
weights.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from advtransfer.analysis.measures.golden import (COUNTS_FILE, KEY, META_FILE, REFRESH_COMMAND, Tolerance, baseline_models,
                                                  bits_to_hex, check_against_baseline, compare_tables, counts_table,
                                                  failure_message, hex_to_bits, kernel_probe, read_baseline,
                                                  same_kernels, write_baseline)
from advtransfer.cli import main

REPO = Path(__file__).resolve().parent.parent
BASELINE = REPO / "results" / "baselines" / "ci"
UPDATE = os.environ.get("ADVTRANSFER_GOLDEN_UPDATE") == "1"
CI_THREADS = 2  # torch threads of CI (OMP_NUM_THREADS unset, tests/conftest.py: 2)


def _threads() -> int:
    meta = BASELINE / META_FILE
    if UPDATE or not meta.is_file():
        return CI_THREADS
    return int(json.loads(meta.read_text())["threads"])


def _grid(args: list[str], threads: int) -> None:
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert main(args) == 0
    finally:
        torch.set_num_threads(old)


def _session_cache_fits(cache: Path) -> bool:
    """Whether the ci models in the session cache can serve the golden run: training pins its
    thread count (part of the recipe hash), so a machine of the baseline's kind trains the
    baseline's weights; a model whose checksum differs (another kind) sends the run to the
    baseline's own copies of the models."""
    if UPDATE or not (BASELINE / META_FILE).is_file():
        return True
    shas = json.loads((BASELINE / META_FILE).read_text()).get("zoo_sha256", {})
    for name, sha in shas.items():
        card = cache / "zoo" / "ci" / f"{name}.json"
        if card.is_file() and json.loads(card.read_text()).get("sha256") != sha:
            return False
    return True


@contextmanager
def _shipped(root: Path | None):
    """Models of ``root`` (laid out as the shipped zoo) serve the runs inside; None: no change."""
    old = os.environ.get("ADVTRANSFER_SHIPPED_ZOO")
    if root is not None:
        os.environ["ADVTRANSFER_SHIPPED_ZOO"] = str(root)
    try:
        yield
    finally:
        if root is not None:
            if old is None:
                os.environ.pop("ADVTRANSFER_SHIPPED_ZOO", None)
            else:
                os.environ["ADVTRANSFER_SHIPPED_ZOO"] = old


@pytest.fixture(scope="module")
def golden(tmp_path_factory, cache_dir, ci_run):
    """The session's run of grids/ci.yaml (tests/conftest.py: the CLI at 2 torch threads, models
    trained with their pinned thread count into the session cache) when it matches the baseline's
    thread count and weights; else one run of this module's own at the baseline's thread count on
    the baseline's own models. ``exact``: whether this machine's kernels round as the baseline's."""
    threads = _threads()
    tmp = tmp_path_factory.mktemp("golden")
    fits = _session_cache_fits(Path(cache_dir))
    models = None if fits else baseline_models(BASELINE)
    cache = cache_dir if fits else tmp / "cache"
    if fits and threads == int(os.environ.get("OMP_NUM_THREADS") or 2):
        run = ci_run["run"]
    else:
        run = tmp / "ci"
        with _shipped(models):
            _grid(["grid", "ci", "--out", str(run), "--no-progress", "--no-plot", "--cache-dir", str(cache)], threads)
    exact = UPDATE or same_kernels(read_baseline(BASELINE)[1], BASELINE, threads)
    return {"run": run, "cache": cache, "threads": threads, "tmp": tmp, "table": counts_table(run),
            "models": models, "exact": exact}


def test_ci_run_matches_committed_baseline(golden):
    if UPDATE:
        write_baseline(golden["run"], BASELINE, threads=golden["threads"], models_from=golden["cache"])
    base, meta = read_baseline(BASELINE)
    assert meta["threads"] == golden["threads"]
    # the baseline keeps its models, so no machine falls back to comparing models trained anew
    assert baseline_models(BASELINE) is not None and meta.get("kernel_probe"), (
        f"{BASELINE} lacks its models (zoo/) or kernel probe: refresh it with `{REFRESH_COMMAND}`")
    # the run used the baseline's weights (its copies, or the session's when bit-identical); a
    # changed ci recipe makes the copies stale (the grid then trains anew): the baseline must be refreshed
    t = golden["table"].merge(base, on=list(KEY), suffixes=("", "_base"))
    stale = t[(t["surrogate_sha"] != t["surrogate_sha_base"]) | (t["victim_sha"] != t["victim_sha_base"])]
    assert stale.empty, (f"{len(stale)} rows ran on other weights than the baseline's (a ci recipe changed?): "
                         f"refresh the baseline with `{REFRESH_COMMAND}`")
    moved, within = compare_tables(golden["table"], base, exact=golden["exact"])
    assert not moved, failure_message(moved, golden["run"], BASELINE, meta=meta, n_rows=len(golden["table"]),
                                      exact=golden["exact"])
    # every row of the grid is in the baseline: 3 surrogates x 2 attacks x 2 eps x 1 seed x 5 victims
    assert len(base) == 60 and base["n"].eq(200).all()


def test_kernel_probe_is_repeatable_and_sees_other_weights(tmp_path):
    """The probe is a function of the kernels and the weights: the same models give the same probe
    twice (so the exact rule can rely on it), and one changed weight gives another."""
    import shutil

    from safetensors.torch import load_file, save_file

    from advtransfer.core.utils import sha256_file

    root = baseline_models(BASELINE)
    assert root is not None
    a = kernel_probe(root, "ci", 2, batch=8)
    assert a == kernel_probe(root, "ci", 2, batch=8)
    copy = tmp_path / "zoo"
    shutil.copytree(root, copy)
    card_file = next(iter(sorted((copy / "ci").glob("*.json"))))
    weights = card_file.with_suffix(".safetensors")
    flat = load_file(str(weights))
    key = next(k for k, v in flat.items() if v.is_floating_point() and v.ndim == 4)
    flat[key] = flat[key].clone()
    flat[key].view(-1)[0] += 1e-3
    save_file(flat, str(weights))
    card = json.loads(card_file.read_text())
    card["sha256"] = sha256_file(weights)
    card_file.write_text(json.dumps(card))
    assert kernel_probe(copy, "ci", 2, batch=8) != a


def _write_planted_grid(path: Path) -> Path:
    grid = yaml.safe_load((REPO / "grids" / "ci.yaml").read_text())
    # I-FGSM's default step is alpha = eps / steps (0.2 eps at the ci grid's 5 steps); +10% makes it 0.22 eps
    grid["attacks"] = {"ifgsm": {"alpha_over_eps": 0.22}}
    # one budget is enough to plant the change (and halves the run): 4/255, where 5 steps of 0.22 eps
    # still differ from 5 of 0.2 eps on some images (measured on the baseline's models: 3 rows, 5
    # images moved at 4/255; at 8/255, where the ci models are mostly fooled either way, none)
    grid["eps"] = ["4/255"]
    path.write_text(yaml.safe_dump(grid))
    return path


def test_planted_step_size_change_is_caught(golden, capsys):
    base_dir = golden["tmp"] / "baseline"
    write_baseline(golden["run"], base_dir, threads=golden["threads"])
    # the baseline round-trips: the run matches its own baseline exactly, through the CLI too
    assert check_against_baseline(golden["run"], base_dir) == []
    assert main(["golden", str(golden["run"]), "--check", "--baseline", str(base_dir)]) == 0
    assert "golden check passed: 60 rows" in capsys.readouterr().out

    planted = golden["tmp"] / "planted"
    grid = _write_planted_grid(golden["tmp"] / "planted.yaml")
    with _shipped(golden["models"]):  # the golden run's models, whichever served it
        _grid(["grid", str(grid), "--out", str(planted), "--no-progress", "--no-plot", "--cache-dir",
               str(golden["cache"])], golden["threads"])
    capsys.readouterr()
    moved = check_against_baseline(planted, base_dir)
    by = {s: [m for m in moved if m.status == s] for s in ("moved", "new", "missing")}
    # the planted run has only ifgsm at 4/255: every mifgsm row and every 8/255 row of the baseline is missing
    assert len(by["missing"]) == 45
    assert {(m.key["attack_label"], m.key["eps_str"]) for m in by["missing"]} == {
        ("mifgsm", "4/255"), ("mifgsm", "8/255"), ("ifgsm", "8/255")}
    assert by["new"] == []
    # the step-size change moves ifgsm rows, and only those; each is named with its counts
    assert by["moved"] and {m.key["attack_label"] for m in by["moved"]} == {"ifgsm"}
    for m in by["moved"]:
        assert m.reasons  # which rule fired (row McNemar, the 5-point cap, or the group shift)
        assert m.before[:2] == m.after[:2]  # same images, same victims: only the successes moved
    assert main(["golden", str(planted), "--check", "--baseline", str(base_dir)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("golden check failed")
    for m in by["moved"]:
        assert m.label() in out and f"{m.before[2]}/{m.before[1]} fooled" in out and f"{m.after[2]}/{m.after[1]}" in out
    assert REFRESH_COMMAND in out and "missing row" in out


# --- the rule on hand-made changes of the real table (no further runs) ---------------------------

def _flip(table: pd.DataFrame, row: int, up: int, down: int, other_weights: bool = True) -> pd.DataFrame:
    """A copy of ``table`` where, in ``row``, ``up`` clean-correct unfooled images become fooled
    and ``down`` fooled images become unfooled (n_success adjusted); ``other_weights``: the row's
    victim checksum changes too, as when the zoo trained on another kind of machine."""
    t = table.copy()
    if other_weights:
        t.loc[row, "victim_sha"] = "0" * 12
    r = t.loc[row]
    n = int(r["n"])
    clean, succ = hex_to_bits(r["clean_hex"], n), hex_to_bits(r["success_hex"], n)
    ups = [i for i in range(n) if clean[i] and not succ[i]][:up]
    downs = [i for i in range(n) if succ[i]][:down]
    assert len(ups) == up and len(downs) == down
    succ[ups] = True
    succ[downs] = False
    t.loc[row, "success_hex"] = bits_to_hex(torch.arange(n).numpy(), succ)
    t.loc[row, "n_success"] = int(succ.sum())
    return t


def test_bits_round_trip():
    import numpy as np

    idx = np.arange(10)
    bits = np.array([1, 0, 0, 1, 0, 0, 0, 0, 0, 1], dtype=bool)
    assert bits_to_hex(idx, bits) == format(1 + 8 + 512, "x") == "209"
    assert hex_to_bits("209", 10).tolist() == bits.tolist()
    assert bits_to_hex(idx, np.zeros(10, bool)) == "0"


def test_rule_on_hand_made_changes(golden):
    t = golden["table"]
    # a row with room both ways (>= 10 fooled and >= 20 clean-correct unfooled images)
    room = (t["n_success"] >= 10) & (t["n_clean_correct"] - t["n_success"] >= 20)
    row = int(room.idxmax())
    assert room[row]
    assert compare_tables(t, t) == ([], 0)
    # with the baseline's weights the run is bit-reproducible: one changed image is a change
    moved, _ = compare_tables(_flip(t, row, 1, 0, other_weights=False), t)
    assert len(moved) == 1 and moved[0].reasons == ["1 image(s) changed with the baseline's weights"]
    moved, _ = compare_tables(_flip(t, row, 1, 1, other_weights=False), t)  # counts equal, bits not
    assert len(moved) == 1 and moved[0].before == moved[0].after
    # the baseline's weights on kernels that round differently (probe differs): the statistical rule
    moved, within = compare_tables(_flip(t, row, 1, 0, other_weights=False), t, exact=False)
    assert moved == [] and within == 1
    moved, _ = compare_tables(_flip(t, row, 8, 0, other_weights=False), t, exact=False)
    assert len(moved) == 1 and not moved[0].weights_changed and moved[0].reasons == ["p < 0.01"] + (
        ["|change| > 5 points"] if 800 / int(t.loc[row, "n_clean_correct"]) > 5 else [])
    # other weights (another machine kind): the statistical rule. Boundary noise: 3 flips up, 2 down -> McNemar p = 1, 0.7 points: within tolerance
    moved, within = compare_tables(_flip(t, row, 3, 2), t)
    assert moved == [] and within == 1
    # 7 flips all one way: p = 2 * 2**-7 = 0.0156 > 0.01, so only the 5-point cap can fire (7 of fewer
    # than 140 paired images); the check must agree with that hand computation
    n_pairs = int(t.loc[row, "n_clean_correct"])
    moved, _ = compare_tables(_flip(t, row, 7, 0), t)
    assert bool(moved) == (100 * 7 / n_pairs > 5)
    # 8 flips one way: p = 2 * 2**-8 = 0.0078 < 0.01 -> moved, with the counts before and after
    moved, _ = compare_tables(_flip(t, row, 8, 0), t)
    assert len(moved) == 1 and moved[0].status == "moved"
    m = moved[0]
    assert (m.now_only, m.base_only, m.n_pairs) == (8, 0, n_pairs)
    assert m.p_mcnemar == pytest.approx(2 * 0.5 ** 8)
    assert m.before[2] + 8 == m.after[2] and m.diff_points == pytest.approx(800 / n_pairs)
    # a mixed change of more than 5 points: 20 up, 8 down (p = 0.036 > 0.01; 12 of <= 200 images > 5 points)
    # is caught by the cap alone
    moved, _ = compare_tables(_flip(t, row, 20, 8), t, Tolerance(alpha=0.01, max_points=5.0))
    assert len(moved) == 1 and moved[0].reasons == ["|change| > 5 points"]
    assert moved[0].p_mcnemar == pytest.approx(0.0357, abs=1e-4)
    # a shift of a whole (attack, eps) group: 4 up in each of 6 rows (row p = 0.125 each) -> stratified p < 0.001
    group = t[(t.attack_label == t.loc[row, "attack_label"]) & (t.eps_str == t.loc[row, "eps_str"])
              & (t.n_clean_correct - t.n_success >= 4)].index[:6]
    shifted = t
    for i in group:
        shifted = _flip(shifted, int(i), 4, 0)
    moved, _ = compare_tables(shifted, t)
    assert len(group) == 6 and len(moved) == 6 and all(m.reasons[-1].startswith("group up") for m in moved)
    # rows in only one table
    moved, _ = compare_tables(t.drop(index=row), t)
    assert [m.status for m in moved] == ["missing"]
    moved, _ = compare_tables(t, t.drop(index=row))
    assert [m.status for m in moved] == ["new"]


def test_bad_baseline_folder_is_one_line_error(golden, tmp_path, capsys):
    assert main(["golden", str(golden["run"]), "--check", "--baseline", str(tmp_path / "none")]) == 2
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert len(err) == 1 and err[0].startswith("advtransfer: error:") and COUNTS_FILE in err[0]


def test_default_baseline_is_the_committed_one(golden):
    """Without --baseline the CLI checks against results/baselines/<grid> of the checkout."""
    from advtransfer.cli.golden import default_baseline

    assert default_baseline(golden["run"]) == BASELINE
