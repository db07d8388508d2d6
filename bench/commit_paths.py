"""What a small table's merge commit costs, and what the cheapest commit delta-rs allows costs:
the per-table floor under the many-tables merge (issue #31's 300/30 ratio).

For ``--tables`` tables of ``--rows`` rows (one data file each, local disk), five rows changed:

- ``merge``: what the driver path does per table: ``DeltaTable.merge`` (DataFusion's plan
  and copy-on-write of the file) with an app transaction;
- ``cow``: a hand-made copy-on-write: read the one file with pyarrow, replace the changed
  rows, write the new file, and commit remove + add with the app transaction through
  ``create_write_transaction`` (no change data feed files, no deletion vectors, no stats
  beyond the key's: a lower bound, not a product path).

Prints milliseconds per table for each and their ratio. Run: ``.venv/bin/python bench/commit_paths.py``."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction


def _tables(root: str, n: int, rows: int) -> list[str]:
    paths = []
    for i in range(n):
        p = os.path.join(root, f"t{i}")
        shutil.rmtree(p, ignore_errors=True)
        write_deltalake(p, pa.table({"id": pa.array(range(rows), pa.int64()),
                                     "v": pa.array([f"x{j}" for j in range(rows)])}))
        paths.append(p)
    return paths


CHANGES = pa.table({"id": pa.array([1, 2, 3, 4, 5], pa.int64()), "v": pa.array(list("abcde"))})


def merge(path: str) -> None:
    DeltaTable(path).merge(CHANGES, "t.id = s.id", source_alias="s", target_alias="t",
                           commit_properties=CommitProperties(app_transactions=[Transaction("bench", 1)])
                           ).when_matched_update_all().when_not_matched_insert_all().execute()


def cow(path: str) -> None:
    dt = DeltaTable(path)
    (old_file,) = pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist()
    old = pq.read_table(os.path.join(path, old_file))
    new = pa.concat_tables([old.filter(pc.invert(pc.is_in(old["id"], CHANGES["id"]))), CHANGES])
    name = f"part-{uuid.uuid4()}.parquet"
    pq.write_table(new, os.path.join(path, name))
    stats = {"numRecords": new.num_rows, "minValues": {"id": pc.min(new["id"]).as_py()},
             "maxValues": {"id": pc.max(new["id"]).as_py()}, "nullCount": {"id": 0, "v": 0}}
    now = int(time.time() * 1000)
    dt.create_write_transaction(
        [RemoveAction(path=old_file, data_change=True, deletion_timestamp=now),
         AddAction(path=name, size=os.path.getsize(os.path.join(path, name)), partition_values={},
                   modification_time=now, data_change=True, stats=json.dumps(stats))],
        "append", dt.schema(), commit_properties=CommitProperties(app_transactions=[Transaction("bench", 1)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=60)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="pgcdc-commit-paths-")
    try:
        best = {}
        for _ in range(a.rounds):
            for name, fn in (("merge", merge), ("cow", cow)):
                paths = _tables(root, a.tables, a.rows)
                t0 = time.perf_counter()
                for p in paths:
                    fn(p)
                ms = (time.perf_counter() - t0) / a.tables * 1000
                best[name] = min(best.get(name, ms), ms)
                assert DeltaTable(paths[0]).to_pyarrow_table().num_rows == a.rows  # 5 rows replaced in place
        print(f"RESULT {a.tables} tables of {a.rows} rows, 5 changed, best of {a.rounds}: merge {best['merge']:.1f} "
              f"ms/table, hand-made copy-on-write commit {best['cow']:.1f} ms/table; ratio cow/merge "
              f"{best['cow'] / best['merge']:.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
