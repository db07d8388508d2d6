"""A merge's cost follows the batch, not the table (issue #14 §1), on both engines: the
bootstrap writes the rows sorted by the key in files of ``target_file_mb``, and a merge
whose changes fall in one key range rewrites only the files of that range (the files the
merge's commit removed, read from the Delta log), the other files untouched. The rows
are inserted into PostgreSQL in random key order, so the layout is the bootstrap's doing,
not the snapshot's order."""

from __future__ import annotations

import pyarrow as pa
import pytest
from lake_helpers import drain, sql
from matrix import servers_in_turn

from airflow_pgcdc.lake.tables import delta_table_url
from airflow_pgcdc.merge.jars import unavailable_reason
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.store import s3 as s3store
from airflow_pgcdc.verify import verify_table

_NO_JARS = unavailable_reason()
_JARS = pytest.mark.skipif(_NO_JARS is not None, reason=_NO_JARS or "")
ENGINES = [
    pytest.param("delta-rs", id="delta-rs"),
    pytest.param("delta-spark", id="delta-spark", marks=_JARS),
]

pytestmark = pytest.mark.delta_spark  # its engine parameters need Delta in the session


def files(url: str) -> dict[str, tuple[int, int]]:
    """The table's data files: path -> (min id, max id) from the Delta log's statistics."""
    from deltalake import DeltaTable

    dt = DeltaTable(url, storage_options=s3store.delta_storage_options())
    adds = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
    return {p: (lo, hi) for p, lo, hi in zip(adds["path"], adds["min.id"], adds["max.id"], strict=True)}


@servers_in_turn("engine", ENGINES)  # the engines read the same windows from either server
def test_merge_rewrites_only_the_files_of_the_key_range_it_touches(engine, fresh_db, slot_name, store, spark):
    client, src, lake = store
    db = fresh_db
    sql(db, "CREATE TABLE t (id bigint PRIMARY KEY, v text)")
    sql(db, "INSERT INTO t SELECT g, md5(g::text) || md5((g * 7)::text) FROM generate_series(1, 20000) g "
            "ORDER BY random()")
    sql(db, "CREATE PUBLICATION pub FOR TABLE t")
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client)
    boot = merge_slot(spark, store=src, slot=slot, delta=lake, engine=engine, max_windows=0,
                      target_file_mb=0.1).tables[0]
    assert boot.action == "bootstrapped", boot
    url = delta_table_url(lake, "public", "t")
    before = files(url)
    assert len(before) >= 6, before
    # sorted by the key: the files' key ranges do not overlap
    spans = sorted(before.values())
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:], strict=False)), spans
    # changes in one key range (updates, a delete, an insert just past it: still inside
    # the file's range or a new file)
    sql(db, "UPDATE t SET v = 'changed' WHERE id BETWEEN 100 AND 140")
    sql(db, "DELETE FROM t WHERE id = 120")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake, engine=engine).tables[0]
    assert out.action == "merged", out
    after = files(url)
    removed = [p for p in before if p not in after]
    touched = [p for p, (lo, hi) in before.items() if lo <= 140 and hi >= 100]
    assert sorted(removed) == sorted(touched) and len(removed) <= 2, (removed, touched, before)
    assert len(after) - len(before) == 0 or len(after) - len(before) <= len(removed), after
    report = verify_table(db, lake, "public", "t")
    assert report.equal, report.to_dict()
    # scattered keys: each touched file rewritten, the others kept
    sql(db, "UPDATE t SET v = 'again' WHERE id IN (5, 19990)")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake, engine=engine)
    kept = files(url)
    assert len([p for p in after if p not in kept]) == 2, (after, kept)
    assert verify_table(db, lake, "public", "t").equal
