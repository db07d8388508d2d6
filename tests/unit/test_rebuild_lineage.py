"""The rebuild operator's OpenLineage datasets (``PgcdcRebuildOperator._lineage_of``): the
store in, the live tables it swapped in out (not the scratch ones the merge wrote)."""

from __future__ import annotations

import json

from airflow_pgcdc.operators.rebuild import PgcdcRebuildOperator


def test_the_live_tables_swapped_in_are_the_outputs(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_PGCDC_S3", json.dumps({"conn_type": "aws", "login": "key", "password": "secret",
                                                             "extra": {"endpoint_url": "http://127.0.0.1:9"}}))
    op = PgcdcRebuildOperator(task_id="rebuild", store="s3://bkt/cdc", slot="s1", delta="s3://bkt/lake",
                              aws_conn_id="pgcdc_s3")
    result = {"tables": [{"table": "public.t", "action": "bootstrapped",
                          "delta_url": "s3a://bkt/lake_rebuild/run/public.t"}],
              "rebuild": {"swapped": [{"live": "s3://bkt/lake/public.t", "rebuilt": "s3://bkt/lake_rebuild/run/public.t",
                                       "window": 3}]}}
    inputs, outputs = op._lineage_of(result)
    assert [(d["namespace"], d["name"]) for d in inputs] == [("s3://bkt", "cdc/s1/snapshot"), ("s3://bkt", "cdc/s1/changes")]
    assert [(d["namespace"], d["name"]) for d in outputs] == [("s3://bkt", "lake/public.t")]
    assert op._lineage_of({"tables": result["tables"], "rebuild": {"swapped": []}}) is None  # swap=False
