"""lake.inspect.app_version: a table handle's app transaction versions, read once per loaded
version (a real delta-rs table on the local file system)."""

from __future__ import annotations

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from airflow_pgcdc.lake.inspect import app_version, merged_version


def _commit(path, rows: int, **versions: int) -> None:
    write_deltalake(str(path), pa.table({"id": pa.array(range(rows), pa.int64())}), mode="append",
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(a, v) for a, v in versions.items()]))


def test_the_answers_follow_the_handle_s_version(tmp_path):
    _commit(tmp_path, 1, a=3)
    dt = DeltaTable(str(tmp_path))
    assert app_version(dt, "a") == 3
    assert app_version(dt, "b") is None
    _commit(tmp_path, 1, a=4, b=0)  # another writer: this handle still has the old version
    assert (app_version(dt, "a"), app_version(dt, "b")) == (3, None)
    dt.update_incremental()
    assert (app_version(dt, "a"), app_version(dt, "b")) == (4, 0)
    assert merged_version(dt, "b") == 0


def test_a_commit_through_the_handle_is_seen(tmp_path):
    _commit(tmp_path, 1, a=1)
    dt = DeltaTable(str(tmp_path))
    assert app_version(dt, "a") == 1
    write_deltalake(dt, pa.table({"id": pa.array([9], pa.int64())}), mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction("a", 2)]))
    assert app_version(dt, "a") == 2


def test_answers_equal_delta_rs_own(tmp_path):
    _commit(tmp_path, 2, x=7, y=1)
    dt = DeltaTable(str(tmp_path))
    for app in ("x", "y", "z"):
        assert app_version(dt, app) == dt.transaction_version(app)
