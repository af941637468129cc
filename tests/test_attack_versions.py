"""Attack versions: every registered attack has a kind and a version, the version enters the cell
id, a changed output without a bumped version fails, and a changed attack re-crafts its cells."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from advtransfer.attacks import ATTACKS
from advtransfer.attacks.base import ATTACK_KINDS
from advtransfer.attacks.fingerprint import fingerprint

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
    assert rec is not None, f"attack {name!r} has no recorded fingerprint: run `{REFRESH}`"
    version = ATTACKS.get(name).version
    assert version >= rec["version"], f"attack {name!r}: version went down from {rec['version']} to {version}"
    fp = fingerprint(name)
    if version == rec["version"]:
        assert fp == rec["fingerprint"], (
            f"attack {name!r} changed its output but not its version ({version}): bump `version=` in its "
            f"register_attack line so cached examples of the old code are not reused, then run `{REFRESH}`")
    else:
        pytest.fail(f"attack {name!r} is at version {version}, the record at {rec['version']}: run `{REFRESH}`")


def test_fingerprint_sees_a_one_percent_change_of_step_size():
    """The fingerprint is sensitive enough to catch a small change of an attack's arithmetic."""
    from advtransfer.attacks import SurrogateSet, create_attack
    from advtransfer.attacks.fingerprint import fixed_input

    models, x, y, index = fixed_input()
    a = create_attack("mifgsm", eps=8 / 255, steps=2)(SurrogateSet(models), x, y, index)
    b = create_attack("mifgsm", eps=8 / 255, steps=2, alpha=1.01 * 4 / 255)(SurrogateSet(models), x, y, index)
    assert (a - b).abs().max() > 2 ** -30


def test_alias_resolves_and_is_not_listed():
    assert ATTACKS.get("bim") is ATTACKS.get("ifgsm")
    assert "bim" not in ATTACKS.names() and "bim" in ATTACKS


def test_changed_attack_recrafts(tmp_path, cache_dir, monkeypatch):
    """A bumped attack version gives new cell ids: the grid crafts again instead of reusing the
    examples the older code cached (the stale-cache bug), and the table records the version."""
    import yaml

    from advtransfer.cli import main
    from advtransfer.store import RunStore

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


def test_readme_tables_are_generated_from_the_schema():
    """The README's column tables are the schema module's (regenerate: python -m advtransfer.schema)."""
    from advtransfer import schema

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for table in schema.TABLES:
        assert schema.readme_block(table) in readme, f"README's {table} table is stale: paste `python -m advtransfer.schema`"
