"""Run-folder files: a writer killed mid-write leaves a temporary file that the merge ignores and
the next run removes, so a rerun after kill -9 neither fails nor leaves stray files."""
from __future__ import annotations

import pandas as pd

from advtransfer.store import RunStore


def _rows(cell: str) -> pd.DataFrame:
    return pd.DataFrame({"cell_id": [cell, cell], "victim": ["v1", "v2"], "surrogate": ["s", "s"],
                         "attack_label": ["a", "a"], "eps": [8 / 255] * 2, "seed": [0, 0]})


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
