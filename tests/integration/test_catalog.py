"""The merge keeps a Hive Metastore in step with the Delta tables (``pgcdc merge --catalog
thrift://…``), against a real standalone metastore (Hive 4.0.1, embedded Derby) started by the
test bed, PostgreSQL, SeaweedFS and Spark.

Checked through Spark SQL (``SELECT … FROM db.table``, Spark's Hive 4 client in a process of
its own) and through the metastore's own Thrift interface: every table is registered at its
mapped name as Spark registers a Delta table (external, provider ``delta``, the table's
``s3a://`` URL as ``path``, its columns), names that differ only in case or in characters the
metastore does not take land apart, a table's own ``catalog_name`` is used; a merge that
adds a column updates the entry and leaves the others untouched; a table taken out of the
publication stays registered, marked; a rebuild registers the live tables it swaps in, not its
scratch copies; a metastore that cannot be reached fails the job
after every table was merged (``CatalogNotUpdated``), and the next merge registers them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lake_helpers import drain, sql
from matrix import on_pg18

from airflow_pgcdc.lake.catalog import Metastore, catalog_names
from airflow_pgcdc.lake.tables import delta_table_url
from airflow_pgcdc.merge.errors import CatalogNotUpdated
from airflow_pgcdc.merge.job import merge_slot
from airflow_pgcdc.snapshot.export import snapshot_to_s3
from airflow_pgcdc.testing.processes import free_port
from airflow_pgcdc.verify import verify_table

TABLES = [("public", "orders"), ("Sales", "Odd Name"), ("Sales", "odd name"), ("public", "items")]


def _spark_sql(uri: str, statements: list[str]) -> list:
    """Each statement's rows (as text), read by a Spark session of its own with Hive support."""
    script = Path(__file__).with_name("spark_by_name.py")
    done = subprocess.run([sys.executable, str(script), uri, *statements], capture_output=True, text=True,
                          timeout=900, env=dict(os.environ), check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("[")]


@pytest.mark.slow
@on_pg18("the catalog is the merge's: no server difference")
def test_the_merge_keeps_a_hive_metastore_in_step(fresh_db, slot_name, store, spark, hive_metastore):
    client, src, lake = store
    db = fresh_db
    sql(db, 'CREATE SCHEMA "Sales"')
    for schema, table in TABLES:
        sql(db, f'CREATE TABLE "{schema}"."{table}" (id int PRIMARY KEY, v text)')
        sql(db, f'INSERT INTO "{schema}"."{table}" SELECT g, \'v\' || g FROM generate_series(1, 3) g')
    sql(db, 'CREATE PUBLICATION pub FOR TABLE ' + ", ".join(f'"{s}"."{t}"' for s, t in TABLES))
    slot = slot_name()
    snapshot_to_s3(db, src, slot=slot, publications="pub", s3=client, workers=1, worker_processes=False)
    asked = dict(catalog=hive_metastore.uri, table_options={"public.items": {"catalog_name": "shop.line_items"}})

    out = merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    where = {(s, t): catalog_names(s, t) for s, t in TABLES[:3]} | {("public", "items"): ("shop", "line_items")}
    assert where[("Sales", "Odd Name")] != where[("Sales", "odd name")]
    assert out.catalog == {f"{d}.{n}": "created" for d, n in where.values()}, out.catalog
    with Metastore(hive_metastore.uri) as ms:
        assert {"public", "shop", catalog_names("Sales", "x")[0]} <= set(ms.databases())
        for (schema, table), (d, n) in where.items():
            entry = ms.table(d, n)
            assert entry.tableType == "EXTERNAL_TABLE" and entry.parameters["EXTERNAL"] == "TRUE"
            assert entry.parameters["spark.sql.sources.provider"] == "delta"
            assert (entry.parameters["pgcdc.source_schema"], entry.parameters["pgcdc.source_table"]) == (schema, table)
            assert entry.sd.serdeInfo.parameters["path"] == "s3a://" + delta_table_url(lake, schema, table)[5:]
            assert [(c.name, c.type) for c in entry.sd.cols] == [("id", "int"), ("v", "string")]

    # Spark SQL reads them by name from the metastore (Hive 4 client, Delta, S3A)
    assert _spark_sql(hive_metastore.uri, [
        "SELECT id, v FROM public.orders ORDER BY id",
        "SELECT id, v FROM {} ORDER BY id".format(".".join(f"`{p}`" for p in where[("Sales", "Odd Name")])),
        "SELECT count(*) FROM shop.line_items",
    ]) == [[["1", "v1"], ["2", "v2"], ["3", "v3"]]] * 2 + [[["3"]]]

    # a column added: that entry updated, the others left as they are
    sql(db, "ALTER TABLE orders ADD COLUMN note text; INSERT INTO orders VALUES (9, 'nine', 'n')")
    sql(db, 'UPDATE "Sales"."Odd Name" SET v = \'x\' WHERE id = 1')
    drain(db, src, slot, client)
    out = merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    assert out.catalog["public.orders"] == "updated" and sorted(set(out.catalog.values())) == ["unchanged", "updated"]
    with Metastore(hive_metastore.uri) as ms:
        assert [c.name for c in ms.table("public", "orders").sd.cols] == ["id", "v", "note"]

    # a table out of the publication: its entry stays, marked
    sql(db, "ALTER PUBLICATION pub DROP TABLE items; UPDATE orders SET v = 'y' WHERE id = 2")
    drain(db, src, slot, client, forget_tables=["public.items"])
    out = merge_slot(spark, store=src, slot=slot, delta=lake, **asked)
    with Metastore(hive_metastore.uri) as ms:
        assert ms.table("shop", "line_items").parameters.get("pgcdc.left_pipeline") == "true", out.to_dict()
        assert "pgcdc.left_pipeline" not in ms.table("public", "orders").parameters

    # a rebuild registers the live tables it swapped in, never its scratch copies
    from airflow_pgcdc.merge.rebuild import rebuild_slot

    rebuilt = rebuild_slot(spark, store=src, slot=slot, delta=lake, tables=["public.orders"], **asked)
    assert rebuilt["catalog"] == {"public.orders": "unchanged"}, rebuilt.get("catalog")
    with Metastore(hive_metastore.uri) as ms:
        path = ms.table("public", "orders").sd.serdeInfo.parameters["path"]
    assert path == "s3a://" + delta_table_url(lake, "public", "orders")[5:]
    # the backfill DAG's swap registers from its rebuild's result, which names the scratch root
    from airflow_pgcdc.merge.options import MergeOptions
    from airflow_pgcdc.merge.rebuild import register_live
    from airflow_pgcdc.store.s3 import S3Settings

    scratch = lake + "_rebuild/run1"
    result = {"delta": scratch, "tables": [{"table": "public.orders", "action": "merged",
                                            "delta_url": delta_table_url(scratch, "public", "orders")}]}
    assert register_live(result, lake, MergeOptions(catalog=hive_metastore.uri), slot, S3Settings.from_env()) is None
    assert result["catalog"] == {"public.orders": "unchanged"}, result

    # a metastore that cannot be reached: the tables are merged, the job says the catalog lags
    sql(db, "UPDATE orders SET v = 'z' WHERE id = 3")
    drain(db, src, slot, client)
    with pytest.raises(CatalogNotUpdated) as failed:
        merge_slot(spark, store=src, slot=slot, delta=lake, catalog=f"thrift://127.0.0.1:{free_port()}")
    result = failed.value.result
    assert {t.table: t.action for t in result.tables}["public.orders"] == "merged"
    assert "cannot reach the Hive Metastore" in result.catalog["error"]
    for schema, table in TABLES[:3]:
        assert verify_table(db, lake, schema, table).equal, (schema, table)
