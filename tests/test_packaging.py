"""Packaging: the wheel holds every package and the shipped grids and catalogues, and an
installed (non-editable) copy finds them and runs a grid from any working directory."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = ("grids", "surrogates", "victims")


def _setuptools_config() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_pyproject_lists_every_package_and_maps_the_data_folders():
    from setuptools import find_packages

    cfg = _setuptools_config()
    listed = set(cfg["packages"])
    code = set(find_packages(str(REPO), include=["advtransfer", "advtransfer.*"]))
    # a package missing from the list would be absent from installed copies
    assert {p for p in listed if not p.startswith("advtransfer._data")} == code
    for folder in DATA:
        pkg = f"advtransfer._data.{folder}"
        assert pkg in listed and cfg["package-dir"][pkg] == folder
        assert cfg["package-data"][pkg] == ["*.yaml"] and list((REPO / folder).glob("*.yaml"))
        assert not list((REPO / folder).glob("*.yml"))  # would be left out of the wheel
    # the shipped weights and cards (zoo/<size>/) go into the wheel with their README
    assert cfg["package-dir"]["advtransfer._data.zoo"] == "zoo"
    globs = cfg["package-data"]["advtransfer._data.zoo"]
    shipped = {p.relative_to(REPO / "zoo").as_posix() for p in (REPO / "zoo").rglob("*") if p.is_file()}
    assert shipped and all(any(Path(f).match(g) for g in globs) for f in shipped), shipped


@pytest.mark.slow
def test_installed_copy_runs_the_ci_grid(tmp_path, cache_dir, trained):
    # the ci grid's models, trained into the session cache (already there when the suite's other
    # ci-grid tests ran first); the installed copy below only crafts and evaluates (-n 20)
    import yaml

    grid = yaml.safe_load((REPO / "grids" / "ci.yaml").read_text())
    for name in dict.fromkeys([*grid["victims"], *(m for s in grid["surrogates"] for m in ([s] if isinstance(s, str) else s))]):
        trained(name)
    # a copy of the checkout, so the editable install of the development venv cannot shadow it
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "results", "build", "*.egg-info", "__pycache__", ".pytest_cache"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # reuse this interpreter's packages (torch, pip, setuptools) instead of installing them again
    Path(site, "_base.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    str(src)], check=True, capture_output=True, text=True)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "ADVTRANSFER_CACHE": str(cache_dir), "ADVTRANSFER_SIZE": "ci"}
    env.pop("ADVTRANSFER_ZOO", None)
    env.pop("PYTHONPATH", None)  # a PYTHONPATH pointing at the checkout would shadow the install
    probe = ("import json, advtransfer, advtransfer.core.resources as r, advtransfer.models as m, advtransfer.grid as g;"
             "print(json.dumps({'file': advtransfer.__file__, 'root': str(r.source_root()),"
             " 'grids': str(r.grids_dir()), 'cats': [str(d) for d in r.catalogue_dirs()],"
             " 'results': str(r.results_dir()), 'grid': str(g.resolve_grid_path('ci')),"
             " 'models': len(m.load_specs())}))")
    info = json.loads(subprocess.run([str(py), "-c", probe], cwd=work, env=env, check=True,
                                     capture_output=True, text=True).stdout)
    installed = Path(site) / "advtransfer"
    assert Path(info["file"]).parent == installed and REPO not in Path(info["file"]).parents
    assert info["root"] == "None" and info["results"] == str(work / "results")
    assert info["grids"] == str(installed / "_data" / "grids") and info["grid"].startswith(info["grids"])
    assert info["cats"] == [str(installed / "_data" / d) for d in ("surrogates", "victims")]
    assert info["models"] == len(__import__("advtransfer.models").models.load_specs())

    out = tmp_path / "run"
    proc = subprocess.run([str(venv / "bin" / "advtransfer"), "grid", "ci", "--out", str(out), "-n", "20",
                           "--no-plot", "--attack", "fgsm", "--no-progress"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "results.parquet").is_file()
    assert not (work / "results").exists()  # --out was honoured
