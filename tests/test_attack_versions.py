"""Attack versions: every registered attack has a kind and a version, the version enters the cell
id, a changed output without a bumped version fails, and a changed attack re-crafts its cells."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from advtransfer.attacks import ATTACKS
from advtransfer.attacks.base import ATTACK_KINDS
from advtransfer.attacks.fingerprint import SKETCH_TOL, hash_of, output, same_output, sketch

RECORDED = json.loads((Path(__file__).parent / "attack_fingerprints.json").read_text())
REFRESH = "make fingerprints"


@pytest.mark.parametrize("name", ATTACKS.names())
def test_attack_has_kind_and_version(name):
    cls = ATTACKS.get(name)
    assert cls.kind in ATTACK_KINDS and ATTACKS.tags(name)["kind"] == cls.kind
    assert isinstance(cls.version, int) and cls.version >= 1


@pytest.mark.parametrize("name", ATTACKS.names())
def test_output_changes_only_with_a_new_version(name):
    rec = RECORDED.get(name)
    assert rec is not None and "sketch" in rec, f"attack {name!r} has no recorded fingerprint and sketch: run `{REFRESH}`"
    version = ATTACKS.get(name).version
    assert version >= rec["version"], f"attack {name!r}: version went down from {rec['version']} to {version}"
    if version != rec["version"]:
        pytest.fail(f"attack {name!r} is at version {version}, the record at {rec['version']}: run `{REFRESH}`")
    x_adv, x = output(name)
    if hash_of(x_adv) == rec["fingerprint"]:
        return
    # another machine's kernels round the last bits differently (advtransfer/attacks/fingerprint.py):
    # a changed hash is float noise when the perturbation's sketch stayed within SKETCH_TOL
    same, gap = same_output(sketch(x_adv, x), rec["sketch"])
    assert same, (
        f"attack {name!r} changed its output but not its version ({version}): its perturbation's sketch moved "
        f"by {gap:.3g} (float noise of other kernels: <= {SKETCH_TOL:g}); bump `version=` in its register_attack "
        f"line so cached examples of the old code are not reused, then run `{REFRESH}`")


def test_fingerprint_sees_a_one_percent_change_of_step_size():
    """Both the hash and the sketch catch a small change of an attack's arithmetic: a 1% larger
    MI-FGSM step moves the sketch by far more than the float-noise tolerance."""
    a, x = output("mifgsm")  # 2 steps at 8/255: alpha 4/255
    b, _ = output("mifgsm", {"alpha": 1.01 * 4 / 255})
    assert hash_of(a) != hash_of(b)
    same, gap = same_output(sketch(a, x), sketch(b, x))
    assert not same and gap > 100 * SKETCH_TOL
    # and a change at the float-noise level (1e-10 per pixel, what other kernels give) is accepted
    noisy = a + 1e-10 * torch.randn(a.shape, generator=torch.Generator().manual_seed(0), dtype=a.dtype)
    assert same_output(sketch(noisy, x), sketch(a, x))[0]


def test_alias_resolves_and_is_not_listed():
    assert ATTACKS.get("bim") is ATTACKS.get("ifgsm")
    assert "bim" not in ATTACKS.names() and "bim" in ATTACKS


def test_changed_attack_recrafts(tmp_path, cache_dir, monkeypatch):
    """A bumped attack version gives new cell ids: the grid crafts again instead of reusing the
    examples the older code cached (the stale-cache bug), and the table records the version."""
    import yaml

    from advtransfer.cli import main
    from advtransfer.run.store import RunStore

    grid = {"name": "v", "n": 16, "size": "ci", "eps": ["8/255"], "defaults": {"steps": 2},
            "attacks": {"nifgsm": {}}, "surrogates": ["resnet20_a"], "victims": ["resnet20_b"]}
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(grid))
    out = tmp_path / "run"
    assert main(["grid", str(path), "--out", str(out), "--no-progress", "--no-plot"]) == 0
    first = set(p.name for p in (out / "adv").glob("*.safetensors"))
    df1 = RunStore(out).read_results()
    assert (df1["attack_version"] == ATTACKS.get("nifgsm").version).all()
    # rerun unchanged: nothing new is crafted
    assert main(["grid", str(path), "--out", str(out), "--no-progress", "--no-plot"]) == 0
    assert set(p.name for p in (out / "adv").glob("*.safetensors")) == first
    monkeypatch.setattr(ATTACKS.get("nifgsm"), "version", ATTACKS.get("nifgsm").version + 1)
    assert main(["grid", str(path), "--out", str(out), "--no-progress", "--no-plot"]) == 0
    second = set(p.name for p in (out / "adv").glob("*.safetensors"))
    assert len(second - first) == 1, "the changed attack's cell was not crafted again"
    df2 = RunStore(out).read_results()
    # the new cell supersedes the old one in the table; the old cell's files stay on disk
    assert set(df2["attack_version"]) == {ATTACKS.get("nifgsm").version}
    assert len(list((out / "shards").glob("*.parquet"))) == 2


def test_docs_schema_tables_are_generated_from_the_schema():
    """The column tables of docs/results-table.md are the schema module's (regenerate: python -m advtransfer.core.schema)."""
    from advtransfer.core import schema

    page = (Path(__file__).resolve().parent.parent / "docs" / "results-table.md").read_text()
    for table in schema.TABLES:
        assert schema.readme_block(table) in page, (
            f"docs/results-table.md's {table} table is stale: paste `python -m advtransfer.core.schema`")
