"""Column names Delta accepts only with column mapping (a space, a comma, parentheses,
``=``...) through Delta's Spark engine: such a table is created with
``delta.columnMapping.mode = name``; a table with plain names in the same job keeps the
plain protocol (column mapping shuts out some readers, so it is used only where needed).
Both readers of the store; the Delta table equals PostgreSQL (``pgcdc verify``, delta-rs)
and Spark reads the same rows back. Before, the first merge failed for that table
(``DELTA_INVALID_CHARACTERS_IN_COLUMN_NAMES``); with the table mapped, ``pgcdc verify``
then read every column as NULL (delta-rs' pyarrow dataset ignores column mapping)."""

from __future__ import annotations

import pytest
from lake_helpers import drain, sql
from matrix import servers_in_turn

from airflow_pgcdc.merge.jars import unavailable_reason
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.verify import verify_table

_MISSING = unavailable_reason()
pytestmark = [pytest.mark.delta_spark, pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")]


@servers_in_turn("reader", ["python", "s3a"])  # the readers read the same windows from either server
def test_odd_column_names_on_delta_spark(reader, fresh_db, slot_name, store, spark):
    from deltalake import DeltaTable

    from airflow_pgcdc.lake.inspect import unreadable_features
    from airflow_pgcdc.lake.tables import delta_table_url
    from airflow_pgcdc.merge.sinks.deltars import UnreadableFeatures, plain_dataset
    from airflow_pgcdc.merge.sinks.deltaspark import s3a
    from airflow_pgcdc.store import s3 as s3store

    client, src, lake = store
    db = fresh_db
    sql(db, 'CREATE SCHEMA "my.schema"')
    sql(db, 'CREATE TABLE "my.schema"."Odd Table" ("k.id" int PRIMARY KEY, "a.b" text, "sp ace" int, '
            '"q""uote" text, "_lead" text, "CamelCase" int, "x=(1,2);" text)')
    sql(db, """INSERT INTO "my.schema"."Odd Table" VALUES (1, 'x', 1, 'q', 'l', 1, 'e'), (2, 'y', 2, 'r', 'm', 2, 'f')""")
    sql(db, "CREATE TABLE plain (id int PRIMARY KEY, v text)")
    sql(db, "INSERT INTO plain VALUES (1, 'a'), (2, 'b')")
    sql(db, 'CREATE PUBLICATION pub FOR TABLE "my.schema"."Odd Table", plain')
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    sql(db, """INSERT INTO "my.schema"."Odd Table" VALUES (3, 'z', 3, 's', 'n', 3, 'g')""")
    sql(db, """UPDATE "my.schema"."Odd Table" SET "a.b" = 'x2', "sp ace" = 10, "x=(1,2);" = 'h' WHERE "k.id" = 1""")
    sql(db, """UPDATE "my.schema"."Odd Table" SET "k.id" = 20 WHERE "k.id" = 2""")
    sql(db, """DELETE FROM "my.schema"."Odd Table" WHERE "k.id" = 3""")
    sql(db, "UPDATE plain SET v = 'c' WHERE id = 2")
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-spark", reader=reader)
    assert {t.action for t in out.tables} == {"bootstrapped+merged"}, out.to_dict()
    odd_url = delta_table_url(lake, "my.schema", "Odd Table")
    rows = spark.read.format("delta").load(s3a(odd_url)).collect()
    assert sorted((r["k.id"], r["sp ace"], r["x=(1,2);"]) for r in rows) == sorted(
        sql(db, 'SELECT "k.id", "sp ace", "x=(1,2);" FROM "my.schema"."Odd Table"'))
    result = verify_table(db, lake, "my.schema", "Odd Table")
    assert result.equal, result.to_dict()["counts"]
    assert verify_table(db, lake, "public", "plain").equal
    storage = s3store.delta_storage_options()
    odd = DeltaTable(odd_url, storage_options=storage)
    assert odd.metadata().configuration.get("delta.columnMapping.mode") == "name"
    # delta-rs' pyarrow dataset reads such a table as NULLs without an error: verify reads it
    # through delta-rs' SQL engine, and the delta-rs engine refuses to copy its rows
    assert unreadable_features(odd) == ["column mapping"]
    with pytest.raises(UnreadableFeatures, match="uses column mapping") as refused:
        plain_dataset(odd)
    assert "--engine delta-spark" in refused.value.hint
    plain = DeltaTable(delta_table_url(lake, "public", "plain"), storage_options=storage)
    assert "delta.columnMapping.mode" not in plain.metadata().configuration
    assert "columnMapping" not in (plain.protocol().writer_features or [])
    assert unreadable_features(plain) == [] and plain_dataset(plain).count_rows() == 2
    # later changes still merge into the mapped table
    sql(db, """UPDATE "my.schema"."Odd Table" SET "sp ace" = 99 WHERE "k.id" = 20""")
    drain(db, src, slot, client)
    merge_slot(spark, store=src, slot=slot, delta=lake, engine="delta-spark", reader=reader)
    assert verify_table(db, lake, "my.schema", "Odd Table").equal
    # pgcdc status' figures find the table's objects where the engines put them
    from airflow_pgcdc.lake.inspect import table_figures

    odd.update_incremental()
    figures = table_figures(odd_url, storage_options=storage, client=client)
    assert figures["files"] == len(odd.file_uris()) > 0 and figures["stored_bytes"] > figures["log_bytes"] > 0, figures
