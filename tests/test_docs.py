"""The documentation site builds in strict mode (a broken link, a missing anchor or a page left out
of the nav fails) with its reference pages generated from this checkout's code and its results
pages from the committed claims records, and the README stays a front door."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the detail belongs on a docs page"
    text = "\n".join(lines)
    assert "make grid" in text and "make test" in text
    # one transfer-matrix figure, drawn from the kept rows of the default grid's last full run
    assert "](docs/assets/default-grid.png)" in text and (REPO / "docs" / "assets" / "default-grid.png").stat().st_size > 20_000
    assert (REPO / "results" / "default-grid" / "results.parquet").is_file()


def test_the_site_builds_strictly_with_generated_reference(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    ref = tmp_path / "docs" / "reference"
    for stale in ref.glob("*.md"):  # a checkout's earlier `make docs` output: generate afresh
        if stale.name != "index.md":
            stale.unlink()
    gen = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_reference.py"), str(ref)],
                         capture_output=True, text=True, cwd=REPO)
    assert gen.returncode == 0, gen.stderr
    pages = {p.name for p in ref.glob("*.md")}
    assert {"cli.md", "grid.md", "schema.md", "attacks.md", "models.md"} <= pages
    attacks = (ref / "attacks.md").read_text()
    from advtransfer.attacks import ATTACKS

    for name in ("mifgsm", "cwa", "sgd_uap", "bsr"):
        assert f"## {name}\n" in attacks and ATTACKS.get(name).kind in attacks
    assert "`8/255`" in attacks  # ε's default as a grid file spells it
    assert "`batch_size`" in (ref / "grid.md").read_text() and "`asr_ci_low`" in (ref / "schema.md").read_text()
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_results.py"), str(tmp_path / "docs" / "results")],
                         capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 0, res.stderr
    index = (tmp_path / "docs" / "results" / "index.md").read_text()
    # one page and figure per claim measured at some size, linked from the index
    import yaml

    ids = [c["id"] for c in yaml.safe_load((REPO / "claims" / "cifar10.yaml").read_text())["claims"]]
    for cid in ids:
        assert f"(claims/{cid}.md)" in index and (tmp_path / "docs" / "results" / "claims" / f"{cid}.md").is_file()
    assert (tmp_path / "docs" / "results" / "claims" / "lgv.png").stat().st_size > 5000
    assert "holds (+" in index  # verdicts with their differences, recomputed from the records
    # a claim at equal white-box success says, per regime, where the baseline was matched
    wb = (tmp_path / "docs" / "results" / "claims" / "repr_space_wb.md").read_text()
    assert wb.count("matched to B's white-box success |") == wb.count("| verdict |") > 0
    # the default grid's matrices: one image and one table per radius, from results/default-grid
    grid_page = (tmp_path / "docs" / "results" / "default-grid.md").read_text()
    for eps in ("4-255", "8-255"):
        assert f"default-grid/transfer_mifgsm_linf_eps{eps}.png)" in grid_page
        assert (tmp_path / "docs" / "results" / "default-grid" / f"transfer_mifgsm_linf_eps{eps}.png").stat().st_size > 20_000
    assert grid_page.count("| `resnet20_a` |") == 2
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                           capture_output=True, text=True, cwd=tmp_path, env=env)
    assert build.returncode == 0, build.stdout + build.stderr
    assert (tmp_path / "site" / "reference" / "attacks.html").is_file() and (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "results" / "claims" / "lgv.html").is_file()
    assert (tmp_path / "site" / "results" / "default-grid.html").is_file()
