"""Run-folder files: a writer killed mid-write leaves a temporary file that the merge ignores and
the next run removes, so a rerun after kill -9 neither fails nor leaves stray files."""
from __future__ import annotations

import pandas as pd

from advtransfer.run.store import RunStore


def _rows(cell: str) -> pd.DataFrame:
    return pd.DataFrame({"cell_id": [cell, cell], "victim": ["v1", "v2"], "surrogate": ["s", "s"],
                         "attack_label": [f"a_{cell}"] * 2, "eps": [8 / 255] * 2, "seed": [0, 0]})


def test_merge_ignores_and_run_start_removes_a_killed_writers_temporaries(tmp_path):
    store = RunStore(tmp_path / "run")
    store.write_shard("c1", _rows("c1"))
    store.write_shard("c2", _rows("c2"))
    # what SIGKILL during a write leaves: an empty or partial file under the temporary name
    stale = [tmp_path / "run" / "shards" / ".c3.parquet.k2j4x.parquet", tmp_path / "run" / ".results.csv.a8d.csv"]
    for f in stale:
        f.write_bytes(b"")
    df = store.merge()
    assert len(df) == 4 and set(df["cell_id"]) == {"c1", "c2"}
    assert sorted(store.remove_stale_temporaries()) == sorted(stale)
    assert not [p for p in (tmp_path / "run").rglob(".*") if p.is_file()]
    assert len(store.merge()) == 4  # complete files untouched


def test_a_newer_cell_of_the_same_entry_supersedes_the_older_in_the_table(tmp_path):
    """After an attack's version bump (or an edited parameter) the rerun writes a new cell for the
    same grid entry: the table keeps only the newer cell's rows, the older files stay on disk."""
    import os

    import pandas as pd

    from advtransfer.run.store import RunStore

    logs = []
    store = RunStore(tmp_path, logs.append)
    (tmp_path / "shards").mkdir()

    def shard(cell, version, victims, t):
        rows = pd.DataFrame([{"cell_id": cell, "surrogate": "resnet20_a", "replicate": 0, "attack_label": "naa",
                              "attack_version": version, "eps": 8 / 255, "seed": 0, "victim": v, "asr": 0.1 * version}
                             for v in victims])
        store.write_shard(cell, rows)
        os.utime(tmp_path / "shards" / f"{cell}.parquet", ns=(t, t))

    shard("old", 1, ["resnet20_b", "vgg_b"], 1_000_000_000)
    shard("new", 2, ["resnet20_b"], 2_000_000_000)  # the rerun has evaluated one victim so far
    shard("other", 1, ["vgg_b"], 1_500_000_000)
    other = pd.read_parquet(tmp_path / "shards" / "other.parquet").assign(attack_label="fia")
    store.write_shard("other", other)
    df = store.merge()
    assert set(df["cell_id"]) == {"new", "other"} and list(df[df.cell_id == "new"]["victim"]) == ["resnet20_b"]
    assert any("superseded" in m and "old" in m for m in logs)
    assert (tmp_path / "shards" / "old.parquet").is_file()
