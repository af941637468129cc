"""Plugins (advtransfer/plugins.py): an attack and a network from the user's own files run in a grid
beside native attacks with the serial and the local executor (same table), their code's sha256
enters the cell ids and recipe hashes, a network with the user's own weights file loads, and a
plugin that cannot load is one line and exit 2 before anything is trained or written."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from advtransfer.core.utils import temp_env

PLUGIN = '''
"""The user's own attack and network."""
import torch
import torch.nn as nn

from advtransfer.attacks import Attack, register_attack
from advtransfer.models.archs import ARCHS


@register_attack("my_start_pgd", kind="gradient", version=1)
class MyStartPGD(Attack):
    """I-FGSM from a random start in part of the ball (drawn per image)."""

    extra_defaults = {"start": 0.5}

    def perturb(self, S, x, y, index):
        r = torch.stack([torch.rand(x.shape[1:], generator=g) * 2 - 1 for g in self.rngs(index, "start")]).to(x)
        x_adv = (x + float(self.extra["start"]) * self.eps * r).clamp(0, 1)
        for _ in range(self.steps):
            S.advance()
            x_adv = (x + (x_adv + self.alpha * S.grad(x_adv, y).sign() - x).clamp(-self.eps, self.eps)).clamp(0, 1)
        return x_adv


@ARCHS.register("my_net", family="cnn")
def my_net(num_classes=10, width=8):
    w = width
    return nn.Sequential(nn.Conv2d(3, w, 3, 1, 1), nn.BatchNorm2d(w), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(w, 2 * w, 3, 1, 1), nn.BatchNorm2d(2 * w), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * w, num_classes))
'''

MEASURES = '''
"""The user's own measures of a run folder."""
import pandas as pd
import torch

from advtransfer.analysis.measures import register_measure


@register_measure("agree_pred", loads_models=True)
def agree_pred(ctx):
    """share of adversarial images on which the victim, loaded again, predicts the run's adv_pred"""
    rows = []
    for cell in ctx.cells():
        x, x_adv, y, index = ctx.images(cell.cell_id)
        s = ctx.samples(cell.cell_id)
        for v in ctx.victims(cell.cell_id):
            with torch.no_grad():
                pred = ctx.model(v)(x_adv).argmax(1)
            run_pred = s[s.victim == v].set_index("index").loc[index.numpy(), "adv_pred"].to_numpy()
            rows.append({"cell_id": cell.cell_id, "victim": v, "n": len(pred),
                         "agree": float((pred.numpy() == run_pred).mean())})
    return pd.DataFrame(rows)


@register_measure("not_a_table")
def not_a_table(ctx):
    return [1, 2, 3]
'''

CATALOGUE = {"models": [{"name": "my_net_a", "arch": "my_net", "family": "cnn", "recipe": {
    "method": "standard", "optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 5.0e-4,
    "schedule": "onecycle", "batch_size": 128, "augment": ["flip"], "seed": 0,
    "sizes": {"ci": {"epochs": 1, "train_subset": 1000}}}}]}

GRID = {"name": "plugins", "plugins": ["my_code.py", "my_models.yaml"], "n": 40, "size": "ci", "batch_size": 40,
        "eps": ["8/255"], "defaults": {"steps": 3}, "matched": ["step"],
        "attacks": {"mifgsm": {}, "my_start_pgd": {}},
        "surrogates": ["resnet20_a", "my_net_a"], "victims": ["resnet20_b", "my_net_a"]}
KEY = ["cell_id", "victim"]


def _write(folder: Path, code: str = PLUGIN, grid: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "my_code.py").write_text(code)
    (folder / "my_models.yaml").write_text(yaml.safe_dump(CATALOGUE))
    path = folder / "grid.yaml"
    path.write_text(yaml.safe_dump(grid or GRID))
    return path


def _cli(*args: str) -> tuple[int, str, str]:
    from advtransfer.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(autouse=True)
def _forget_plugins():
    """Each test loads its own files: what a test's plugins registered is unloaded after it."""
    from advtransfer import plugins

    before = set(plugins._LOADED)
    yield
    for ref in set(plugins._LOADED) - before:
        plugins._unload(plugins._LOADED[ref])


@pytest.fixture(scope="module")
def zoo(trained):
    for m in ("resnet20_a", "resnet20_b"):
        trained(m)


def test_plugin_attack_and_network_run_with_serial_local_and_submitit_executors(zoo, tmp_path):
    grid = _write(tmp_path / "user")
    runs = {k: tmp_path / k for k in ("serial", "local", "submitit")}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # what each of the two workers gets (float summation order)
    try:
        rc, _, err = _cli("grid", str(grid), "--out", str(runs["serial"]), "--no-progress", "--no-plot", "--no-report")
        assert rc == 0, err
    finally:
        torch.set_num_threads(threads)
    with temp_env(OMP_NUM_THREADS=2):
        rc, _, err = _cli("grid", str(grid), "--out", str(runs["local"]), "--executor", "local", "--workers", "2",
                          "--no-progress", "--no-plot", "--no-report")
        assert rc == 0, err
        try:
            import submitit  # noqa: F401
        except ImportError:
            runs.pop("submitit")
        else:  # submitit's local cluster: real subprocesses that load the plugins themselves
            (tmp_path / "profile.yaml").write_text("cluster: local\ntimeout_min: 20\n")
            rc, _, err = _cli("grid", str(grid), "--out", str(runs["submitit"]), "--executor", "submitit",
                              "--profile", str(tmp_path / "profile.yaml"), "--workers", "2",
                              "--no-progress", "--no-plot", "--no-report")
            assert rc == 0, err
    tables = {k: pd.read_parquet(r / "results.parquet").sort_values(KEY).reset_index(drop=True) for k, r in runs.items()}
    ref = tables["serial"]
    # 2 surrogates x (mifgsm, my_start_pgd, its matched baseline: a shared cell) x 2 victims
    assert set(ref["attack"]) == {"mifgsm", "my_start_pgd"} and len(ref) == 2 * 3 * 2
    cols = ["cell_id", "victim", "n_clean_correct", "n_success", "grad_evals", "asr"]
    for k in runs:
        pd.testing.assert_frame_equal(tables[k][cols], ref[cols], obj=f"{k} vs serial")
    mine = ref[ref["attack"] == "my_start_pgd"]
    assert (mine["grad_evals"] == 3).all() and (mine["linf_max"] <= 8 / 255 + 1e-6).all()
    assert (ref.loc[ref["is_whitebox"], "asr"] > 0).all()
    manifest = (runs["local"] / "manifest.json").read_text()
    assert "my_code.py" in manifest and "my_start_pgd" in manifest
    # the paired comparison reads the run folder (no plugin needed)
    rc, out, err = _cli("compare", str(runs["serial"]))
    assert rc == 0, err
    assert "my_start_pgd" in out

    # the user's measure (it loads the run's victims, my_net_a among them: the plugin catalogue too)
    # beside the harness's fooled_overlap, then the report shows both tables
    user = tmp_path / "user"
    (user / "my_measures.py").write_text(MEASURES)
    plug = [a for f in ("my_code.py", "my_models.yaml", "my_measures.py") for a in ("--plugin", str(user / f))]
    rc, out, err = _cli("measure", "--list", *plug)
    assert rc == 0 and "fooled_overlap" in out and "agree_pred" in out and "(plugin " in out, err
    rc, out, err = _cli("measure", str(runs["serial"]), "agree_pred,fooled_overlap", *plug)
    assert rc == 0, err
    agree = pd.read_parquet(runs["serial"] / "measures" / "agree_pred.parquet")
    assert len(agree) == len(ref) and (agree["n"] == 40).all()
    # the same weights on the same cached images give the run's predictions (a near-tie logit
    # may round the other way in another batch order: at most one image in 40)
    assert (agree["agree"] >= 39 / 40).all(), agree
    rec = json.loads((runs["serial"] / "measures" / "agree_pred.json").read_text())
    assert rec["plugin_sha256"] == hashlib.sha256((user / "my_measures.py").read_bytes()).hexdigest()
    ov = pd.read_parquet(runs["serial"] / "measures" / "fooled_overlap.parquet")
    assert len(ov) == ref["cell_id"].nunique()  # two victims: one pair per cell
    assert (ov.n_both <= ov[["n_a", "n_b"]].min(axis=1)).all()
    assert (ov.n_a + ov.n_b - ov.n_both <= ov.n_both_correct).all() and ov.jaccard.dropna().between(0, 1).all()
    rc, _, err = _cli("report", str(runs["serial"]))
    assert rc == 0, err
    md = (runs["serial"] / "report" / "report.md").read_text()
    assert "Registered measures" in md and "**agree_pred**" in md and "**fooled_overlap**" in md
    # a measure that returns no table, or an unknown name: one line, exit 2, nothing written
    rc, _, err = _cli("measure", str(runs["serial"]), "not_a_table", *plug)
    assert rc == 2 and "returned list, not a pandas DataFrame" in err and len(err.strip().splitlines()) == 1
    assert not list((runs["serial"] / "measures").glob("not_a_table*"))
    rc, _, err = _cli("measure", str(runs["serial"]), "fooled_overlap,agree_prd", *plug)
    assert rc == 2 and "unknown measure 'agree_prd'; did you mean 'agree_pred'" in err


def test_an_edited_plugin_changes_the_cells_and_models_it_defines(tmp_path):
    from advtransfer.grid import expand_cells, load_grid
    from advtransfer.models import zoo

    grid = _write(tmp_path)

    def ids() -> tuple[dict, str]:
        spec = load_grid(str(grid))
        shas = {m: f"sha-{m}" for m in spec.model_names()}
        cells = {(c.surrogate.name, c.attack.label): c.cell_id for c in expand_cells(spec, shas)}
        return cells, zoo.get_spec("my_net_a").recipe_hash("ci")

    before, recipe_before = ids()
    (tmp_path / "my_code.py").write_text(PLUGIN + "\n# an edit\n")
    after, recipe_after = ids()
    assert recipe_after != recipe_before  # the network's model is retrained
    for key, cid in before.items():
        plugin_cell = key[0] == "my_net_a" or key[1] == "my_start_pgd"
        assert (after[key] != cid) == plugin_cell, key  # native cells on native surrogates keep their ids


def test_a_network_with_the_users_own_weights_file(zoo, tmp_path):
    from advtransfer.models import zoo as z
    from advtransfer.plugins import load_plugins

    (tmp_path / "my_code.py").write_text(PLUGIN)
    load_plugins([str(tmp_path / "my_code.py")])
    from advtransfer.models.archs import build_arch

    mine = build_arch("my_net", num_classes=10)
    torch.save(mine.state_dict(), tmp_path / "weights.pt")
    (tmp_path / "own.yaml").write_text(yaml.safe_dump({"models": [
        {"name": "my_own", "arch": "my_net", "family": "cnn", "pretrained": {"weights": "weights.pt"}}]}))
    load_plugins([str(tmp_path / "own.yaml")])
    z.ensure_trained(["my_own"], "ci", progress=False, log=lambda *_: None)
    model = z.load_model("my_own", "ci")
    x = torch.rand(2, 3, 32, 32)
    assert torch.allclose(model(x), mine.eval()((x - model.mean) / model.std), atol=1e-5)
    card = z.read_card("my_own", "ci")
    # the plugin's edit is another model though the weights file is the same
    (tmp_path / "my_code.py").write_text(PLUGIN + "\n# edited\n")
    load_plugins([str(tmp_path / "my_code.py")])
    assert not z.declared(z.get_spec("my_own")).is_ready("ci")
    z.ensure_trained(["my_own"], "ci", progress=False, log=lambda *_: None)
    assert z.read_card("my_own", "ci")["sha256"] != card["sha256"]


@pytest.mark.parametrize("code,message", [
    ("import torch\ndef broken(:\n", "cannot import it (SyntaxError"),
    ("import torch\nraise RuntimeError('no GPU here')\n", "cannot import it (RuntimeError: no GPU here at line 2)"),
    ("from advtransfer.attacks import Attack, register_attack\n"
     "@register_attack('mifgsm', kind='gradient', version=1)\nclass Mine(Attack):\n    pass\n",
     "registers attack 'mifgsm', which advtransfer itself registered already"),
])
def test_a_broken_plugin_is_one_line_and_exit_2_before_anything_is_written(tmp_path, code, message):
    grid = _write(tmp_path, code)
    run = tmp_path / "run"
    rc, out, err = _cli("grid", str(grid), "--out", str(run), "--no-progress")
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("advtransfer: error: plugin ") and message in lines[0], err
    assert not run.exists()
    # the same through --plugin, for a command that lists the registry
    rc, out, err = _cli("attacks", "--plugin", str(tmp_path / "my_code.py"))
    assert rc == 2 and len(err.strip().splitlines()) == 1 and message in err
    from advtransfer.attacks import ATTACKS

    assert "my_start_pgd" not in ATTACKS  # nothing half-registered


def test_plugin_flag_lists_and_missing_files_and_modules(tmp_path):
    (tmp_path / "my_code.py").write_text(PLUGIN)
    rc, out, err = _cli("attacks", "--plugin", str(tmp_path / "my_code.py"))
    assert rc == 0 and "my_start_pgd" in out and "plugin " in out
    rc, _, err = _cli("attacks", "--plugin", str(tmp_path / "nothere.py"))
    assert rc == 2 and "no such file" in err
    rc, _, err = _cli("attacks", "--plugin", "no_such_pkg.attacks")
    assert rc == 2 and "no module named no_such_pkg.attacks" in err


def test_entry_point_plugins_load_once(tmp_path, monkeypatch):
    import importlib.metadata as md

    from advtransfer import plugins

    (tmp_path / "ep_plugin.py").write_text(PLUGIN.replace("my_start_pgd", "ep_start_pgd").replace('"my_net"', '"ep_net"'))
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = md.EntryPoint(name="demo", value="ep_plugin", group=plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(md, "entry_points", lambda group=None: [ep] if group == plugins.ENTRY_POINT_GROUP else [])
    monkeypatch.setattr(plugins, "_ENTRY_POINTS_DONE", False)
    loaded = plugins.load_plugins()
    from advtransfer.attacks import ATTACKS

    assert [p.kind for p in loaded] == ["entry point"] and "ep_start_pgd" in ATTACKS
    assert ATTACKS.code("ep_start_pgd") == plugins.sha256_of(tmp_path / "ep_plugin.py")
    assert plugins.load_plugins() == loaded  # once per process
    shutil.rmtree(tmp_path / "__pycache__", ignore_errors=True)
