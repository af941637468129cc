"""The CLI end to end on the ci grid (real CIFAR-10, ci-size models trained into the test cache):
adding a victim without re-crafting, reruns, and one-line errors for bad input (kills and resumes
are tests/test_reliability.py's)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parent.parent
from advtransfer.core.schema import RESULTS, names

SCHEMA = names(RESULTS)  # the one schema module the runner writes through

from conftest import cli, write_grid  # noqa: E402  (the session's ci run lives in conftest)


def test_grid_writes_table_examples_and_figures(ci_run):
    run, full = ci_run["run"], ci_run["full"]
    df = pd.read_parquet(run / "results.parquet")
    n_cells = len(full["surrogates"]) * len(full["attacks"]) * len(full["eps"]) * len(full["seeds"])
    assert len(df) == n_cells * len(full["victims"])
    assert not df.duplicated(["cell_id", "victim"]).any()
    assert list(df.columns[:len(SCHEMA)]) == SCHEMA  # schema columns first, in schema order
    assert len(pd.read_csv(run / "results.csv")) == len(df)
    assert len(list((run / "adv").glob("*.safetensors"))) == n_cells
    figs = list((run / "figures").glob("*.png"))
    assert len(figs) == len(full["attacks"]) * len(full["eps"]) and list((run / "figures").glob("*.pdf"))
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["git_sha"] and manifest["versions"]["torch"] == torch.__version__
    assert set(manifest["cells"]) == set(df["cell_id"])
    # white-box cells are flagged, rates are fractions, the ε-ball holds
    assert df.loc[df.victim == df.surrogate, "is_whitebox"].all()
    assert df["asr"].between(0, 1).all() and (df["linf_max"] <= df["eps"] + 1e-6).all()
    assert (df["asr_ci_low"] <= df["asr"]).all() and (df["asr"] <= df["asr_ci_high"]).all()
    # grad_evals: 5 steps (grids/ci.yaml) × number of surrogates
    assert (df["grad_evals"] == 5 * df["n_surrogates"]).all()


def test_added_victim_is_evaluated_without_recrafting(ci_run):
    run = ci_run["run"]
    assert "crafting" in ci_run["first"].stdout
    assert "crafting" not in ci_run["second"].stdout
    now = {p.name: p.stat().st_mtime_ns for p in (run / "adv").glob("*.safetensors")}
    assert now == ci_run["adv_mtimes"], "cached adversarial examples were rewritten"
    df = pd.read_parquet(run / "results.parquet")
    assert ci_run["rows_first"] < len(df) and (df.victim == "mobilenet_a").sum() > 0


def test_rerun_skips_finished_cells(ci_run):
    run = ci_run["run"]
    before = pd.read_parquet(run / "results.parquet")
    again = cli("grid", "ci", "--out", str(run), "--no-progress", "--no-plot")
    assert "crafting" not in again.stdout
    after = pd.read_parquet(run / "results.parquet")
    pd.testing.assert_frame_equal(before.sort_values(["cell_id", "victim"]).reset_index(drop=True),
                                  after.sort_values(["cell_id", "victim"]).reset_index(drop=True))


def test_row_rederived_from_cached_examples(ci_run):
    """Each row's numbers follow from its cached x_adv and the victim loaded with load_model."""
    import advtransfer
    from advtransfer.data import eval_subset, load_cifar10
    from safetensors.torch import load_file

    run = ci_run["run"]
    df = pd.read_parquet(run / "results.parquet")
    row = df[(df.victim == "resnet20_b") & (df.surrogate == "vgg_a") & (df.eps_str == "8/255")].iloc[0]
    t = load_file(str(run / "adv" / f"{row.cell_id}.safetensors"))
    x, y, idx = eval_subset(load_cifar10("test"), int(row.n))
    assert torch.equal(t["index"], idx)
    victim = advtransfer.load_model("resnet20_b", size="ci")
    with torch.no_grad():
        clean_ok = victim(x).argmax(1) == y
        adv_ok = victim(t["x_adv"]).argmax(1) == y
    assert int(clean_ok.sum()) == row.n_clean_correct
    assert int((clean_ok & ~adv_ok).sum()) == row.n_success
    assert float((t["x_adv"] - x).abs().amax()) == pytest.approx(row.linf_max, abs=1e-7)


# --- bad input: one line on stderr, exit code 2, nothing written ---------------------------------

def _bad(tmp_path, *args, match: str, subprocess: bool = False):
    """Exit 2, one ``advtransfer: error:`` line containing ``match``, nothing written. In-process
    (``main``) unless ``subprocess``: one test goes through the installed console entry point,
    the rest skip a Python start-up each."""
    import contextlib
    import io

    from advtransfer.cli import main

    out = tmp_path / "never"
    argv = [*args, "--out", str(out), "--no-progress"]
    if subprocess:
        proc = cli(*argv, check=False)
        rc, err = proc.returncode, proc.stderr
    else:
        buf = io.StringIO()
        with contextlib.redirect_stderr(buf), contextlib.redirect_stdout(io.StringIO()):
            rc = main(argv)
        err = buf.getvalue()
    assert rc == 2, err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("advtransfer: error:"), err
    assert match in lines[0], lines[0]
    assert not out.exists(), "bad input must leave nothing half-written"


def test_unknown_attack(tmp_path):
    _bad(tmp_path, "grid", "ci", "--attack", "mifgsn", match="did you mean 'mifgsm'")


def test_unknown_grid(tmp_path):
    _bad(tmp_path, "grid", "cifar1O", match="did you mean 'cifar10'", subprocess=True)


def test_unknown_model_in_grid(tmp_path):
    g = write_grid(tmp_path / "g.yaml", victims=["resnet20_c"])
    _bad(tmp_path, "grid", str(g), match="resnet20_a")


def test_eps_out_of_range(tmp_path):
    g = write_grid(tmp_path / "g.yaml", eps=["300/255"])
    _bad(tmp_path, "grid", str(g), match="outside (0, 1]")


def test_malformed_grid(tmp_path):
    g = tmp_path / "g.yaml"
    g.write_text("name: x\neps: [8/255\n")
    _bad(tmp_path, "grid", str(g), match="not valid YAML")
    g.write_text(yaml.safe_dump({"name": "x", "eps": ["8/255"], "attacks": {"ifgsm": {}}, "victims": ["vgg_a"]}))
    _bad(tmp_path, "grid", str(g), match="surrogates")


def test_missing_data_folder(tmp_path):
    _bad(tmp_path, "grid", "ci", "--data-dir", str(tmp_path / "nowhere"), match="ADVTRANSFER_DATA")


def _cache_with(tmp_path, cache_dir, name: str) -> Path:
    from advtransfer.models import zoo

    zoo.ensure_trained([name], "ci", progress=False, log=lambda *_: None)
    dst = tmp_path / "cache" / "zoo" / "ci"
    dst.mkdir(parents=True)
    for ext in (".safetensors", ".json"):
        (dst / f"{name}{ext}").write_bytes((Path(cache_dir) / "zoo" / "ci" / f"{name}{ext}").read_bytes())
    return tmp_path / "cache"


def test_corrupt_checkpoint(tmp_path, cache_dir):
    cache = _cache_with(tmp_path, cache_dir, "vgg_a")
    w = cache / "zoo" / "ci" / "vgg_a.safetensors"
    data = bytearray(w.read_bytes())
    data[-100] ^= 0xFF
    w.write_bytes(bytes(data))
    g = write_grid(tmp_path / "g.yaml", surrogates=["vgg_a"], victims=["vgg_a"], n=10)
    _bad(tmp_path, "grid", str(g), "--cache-dir", str(cache), match="sha256")


def test_foreign_checkpoint(tmp_path, cache_dir):
    from safetensors.torch import save_file

    from advtransfer.core.utils import sha256_file

    cache = _cache_with(tmp_path, cache_dir, "vgg_a")
    w = cache / "zoo" / "ci" / "vgg_a.safetensors"
    save_file({"weight": torch.zeros(3, 3)}, str(w))
    card_path = w.with_suffix(".json")
    card = json.loads(card_path.read_text())
    card["sha256"] = sha256_file(w)
    card_path.write_text(json.dumps(card))
    g = write_grid(tmp_path / "g.yaml", surrogates=["vgg_a"], victims=["vgg_a"], n=10)
    _bad(tmp_path, "grid", str(g), "--cache-dir", str(cache), match="does not fit architecture")


def test_help_and_listing_commands():
    assert "grid" in cli("--help").stdout
    out = cli("attacks").stdout
    assert "mifgsm" in out and "vmifgsm" in out
    assert "resnet20_at" in cli("zoo", "list", "--size", "ci").stdout
