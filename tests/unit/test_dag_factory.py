"""The DAG factory (airflow_pgcdc.dags): a pipeline's settings checked with the field
named, read from JSON and YAML, and turned into four DAGs whose tasks use the pipeline's
connections and knobs (no servers: the DAGs are built, not run; test_dag_factory_airflow in
tests/integration runs one)."""

from __future__ import annotations

import datetime
import json

import pytest

from airflow_pgcdc.dags import (
    KINDS,
    Pipeline,
    PipelineConfigError,
    load_pipelines,
    pipeline_dags,
    register,
)

BASE = {"slot": "sales", "publication": "sales_pub", "store": "s3://lake/cdc", "delta": "s3://lake/delta"}


def test_a_pipelines_four_dags_use_its_connections_and_knobs():
    p = Pipeline(name="sales", tables=["s.orders"], postgres_conn_id="sales_pg", aws_conn_id="sales_s3",
                 spark_conn_id="sales_spark", schedule=15, min_bytes=1024, max_rows=5000, engine="delta-spark",
                 as_text={"s.orders": ["odd"]}, retention_hours=720, tags=["team-a"], **BASE)
    dags = pipeline_dags(p)
    assert sorted(dags) == sorted(f"sales_{k}" for k in KINDS)
    inc = dags["sales_incremental"]
    # the schedule: Airflow 3.3's timetable holds it as .delta, 3.0's (the floor) as ._delta
    assert getattr(inc.timetable, "delta", getattr(inc.timetable, "_delta", None)) == datetime.timedelta(minutes=15)
    assert "team-a" in inc.tags and "sales" in inc.tags
    tasks = inc.task_dict
    assert tasks["wait_for_changes"].postgres_conn_id == "sales_pg"
    assert (tasks["drain"].postgres_conn_id, tasks["drain"].aws_conn_id) == ("sales_pg", "sales_s3")
    assert tasks["drain"].as_text == {"s.orders": ["odd"]}
    assert (tasks["merge"].conn_id, tasks["merge"].aws_conn_id, tasks["merge"].engine) == (
        "sales_spark", "sales_s3", "delta-spark")
    params = inc.params.dump()
    assert (params["slot"], params["store"], params["min_bytes"], params["max_rows"]) == (
        "sales", "s3://lake/cdc", 1024, 5000)
    load = dags["sales_initial_load"].task_dict
    assert load["snapshot"].postgres_conn_id == "sales_pg" and load["snapshot"].as_text == {"s.orders": ["odd"]}
    assert dags["sales_initial_load"].params.dump()["tables"] == ["s.orders"]
    back = dags["sales_backfill"].task_dict
    assert back["resync"].as_text == {"s.orders": ["odd"]} and back["rebuild"].conn_id == "sales_spark"
    # a rebuild as of a time (params.until_time) commits with delta-rs, else on the pipeline's engine
    import jinja2

    assert back["rebuild"].until_time == "{{ params.until_time }}"
    assert dags["sales_backfill"].params.dump()["until_time"] is None
    engine = jinja2.Template(back["rebuild"].engine)
    assert [engine.render(params={"until_time": t}) for t in ("2026-11-29T06:00:00", None)] == [
        "delta-rs", "delta-spark"]
    assert dags["sales_maintenance"].params.dump()["retention_hours"] == 720
    assert dags["sales_maintenance"].task_dict["maintain"].aws_conn_id == "sales_s3"


def test_every_merge_of_a_pipeline_gets_its_change_data_feed_and_table_options():
    p = Pipeline(name="sales", change_data_feed=True, table_options={"s.audit": {"change_data_feed": False}},
                 catalog="thrift://hms:9083", catalog_prefix="sales_", **BASE)
    with pytest.raises(PipelineConfigError, match="catalog.*thrift://host:port"):
        Pipeline(name="x", catalog="hms:9083", **BASE)
    merges = [t for d in pipeline_dags(p).values() for t in d.tasks if hasattr(t, "change_data_feed")]
    assert {t.task_id for t in merges} == {"bootstrap", "merge", "merge_resynced", "rebuild"}
    for t in merges:
        assert (t.change_data_feed, t.table_options) == (True, {"s.audit": {"change_data_feed": False}}), t.task_id
    # every merge into the live root registers its tables; the backfill's rebuild merges into a
    # scratch root, and its swap registers the live tables instead
    assert {t.task_id: t.catalog for t in merges} == {"bootstrap": "thrift://hms:9083", "merge": "thrift://hms:9083",
                                                      "merge_resynced": "thrift://hms:9083", "rebuild": None}
    args = pipeline_dags(p)["sales_incremental"].task_dict["merge"]._application_args()
    assert args[args.index("--catalog"):][:4] == ["--catalog", "thrift://hms:9083", "--catalog-prefix", "sales_"]
    assert "--change-data-feed" in args
    assert args[args.index("--table-option"):][:2] == ["--table-option", "s.audit:change_data_feed=false"]


def test_a_pipelines_column_rules_reach_the_snapshot_and_its_key_every_job_that_reads_values():
    p = Pipeline(name="sales", pii={"s.users": {"email": "hash", "ssn": "exclude"}}, pii_key_conn_id="pii_key",
                 **BASE)
    dags = pipeline_dags(p)
    load = dags["sales_initial_load"].task_dict
    assert load["snapshot"].pii == {"s.users": {"email": "hash", "ssn": "exclude"}}
    # the drain, the resync and verify read the rules from the store (the snapshot wrote them)
    keyed = {f"{d}.{t.task_id}" for d, dag in dags.items() for t in dag.tasks
             if getattr(t, "pii_key_conn_id", None) == "pii_key"}
    assert keyed == {"sales_initial_load.snapshot", "sales_initial_load.verify", "sales_incremental.drain",
                     "sales_backfill.resync", "sales_backfill.verify"}
    assert (load["verify"].store, load["verify"].slot) == ("{{ params.store }}", "{{ params.slot }}")
    with pytest.raises(PipelineConfigError, match="pii.*unknown column rule"):
        Pipeline(pii={"s.users": {"email": "encrypt"}}, **BASE)


def test_an_sla_adds_a_freshness_check_after_the_merge():
    assert "freshness" not in pipeline_dags(Pipeline(**BASE))["pgcdc_incremental"].task_dict
    p = Pipeline(max_lag_seconds=900, table_max_lag_seconds={"s.audit": 86400}, **BASE)
    tasks = pipeline_dags(p)["pgcdc_incremental"].task_dict
    check = tasks["freshness"]
    assert (check.max_lag_seconds, check.table_max_lag_seconds) == (900, {"s.audit": 86400.0})
    assert check.upstream_task_ids == {"merge"}
    with pytest.raises(PipelineConfigError, match="table_max_lag_seconds needs max_lag_seconds"):
        Pipeline(table_max_lag_seconds={"s.audit": 1}, **BASE)
    with pytest.raises(PipelineConfigError, match="max_lag_seconds must be a number"):
        Pipeline(max_lag_seconds="soon", **BASE)


def test_the_default_name_keeps_the_example_dag_ids():
    assert sorted(pipeline_dags(Pipeline(**BASE))) == sorted(f"pgcdc_{k}" for k in KINDS)


@pytest.mark.parametrize("change, message", [
    ({"slot": "Sales"}, "slot must be 1-63 lower-case"),
    ({"store": "/tmp/x"}, "store must be an s3://bucket/prefix URL"),
    ({"name": "a b"}, "name must be letters"),
    ({"tables": "s.orders"}, "tables must be a list of schema.table names"),
    ({"tables": ["orders"]}, "tables must be a list of schema.table names"),
    ({"min_bytes": -1}, "min_bytes must be an integer of at least 0"),
    ({"workers": 0}, "workers must be an integer of at least 1"),
    ({"max_delay": "soon"}, "max_delay must be a number"),
    ({"as_text": {"s.t": []}}, "as_text must map schema.table to a list of column names"),
])
def test_bad_settings_are_named(change, message):
    with pytest.raises(PipelineConfigError, match=message):
        Pipeline(**{**BASE, **change})


def test_pipelines_from_json_and_yaml(tmp_path):
    entries = [{**BASE, "name": "sales"}, {**BASE, "name": "billing", "slot": "billing",
                                           "postgres_conn_id": "billing_pg", "schedule": "*/10 * * * *"}]
    (tmp_path / "p.json").write_text(json.dumps({"pipelines": entries}))
    got = load_pipelines(tmp_path / "p.json")
    assert [p.name for p in got] == ["sales", "billing"] and got[1].postgres_conn_id == "billing_pg"
    (tmp_path / "p.yaml").write_text(
        "- name: sales\n  slot: sales\n  publication: sales_pub\n  store: s3://lake/cdc\n  delta: s3://lake/delta\n"
        "  tables: [s.orders, s.items]\n  schedule: 10\n")
    (p,) = load_pipelines(tmp_path / "p.yaml")
    assert p.tables == ("s.orders", "s.items") and p.schedule == datetime.timedelta(minutes=10)
    namespace: dict = {}
    ids = register(namespace, got)
    assert len(ids) == 8 and set(ids) == set(namespace) and "billing_backfill" in namespace


@pytest.mark.parametrize("text, message", [
    ("[]", "expected a non-empty list of pipelines"),
    ("{not json", "not valid JSON"),
    (json.dumps([{**BASE, "colour": "red"}]), r"pipeline 1: unknown setting\(s\) colour"),
    (json.dumps([{"slot": "x"}]), r"pipeline 1: missing setting\(s\) delta, publication, store"),
    (json.dumps([BASE, BASE]), "pipeline name\\(s\\) pgcdc used more than once"),
    (json.dumps([{**BASE, "slot": "BAD"}]), "pipeline 1: pipeline 'pgcdc': slot must be"),
])
def test_a_bad_file_names_the_file_and_the_entry(tmp_path, text, message):
    path = tmp_path / "pipelines.json"
    path.write_text(text)
    with pytest.raises(PipelineConfigError, match=message) as err:
        load_pipelines(path)
    assert str(path) in str(err.value)


def test_a_backfill_until_a_time_refuses_resync_and_verify():
    from airflow_pgcdc.hooks.compat import AirflowFailException

    choose = pipeline_dags(Pipeline(**BASE))["pgcdc_backfill"].task_dict["choose"].python_callable
    base = {"mode": "rebuild", "tables": None, "verify": False, "until_time": "2026-11-29T06:00:00+00:00"}
    assert choose(params=base) == "rebuild"
    for change in ({"verify": True}, {"mode": "resync", "tables": ["public.t"]}):
        with pytest.raises(AirflowFailException, match="until_time rebuilds the tables as of a past time"):
            choose(params={**base, **change})
    assert choose(params={**base, "until_time": None, "verify": True}) == "rebuild"
    slice_ = {**base, "until_time": None, "mode": "resync", "tables": ["public.t"], "where": "tenant = 3"}
    assert choose(params=slice_) == "resync"
    with pytest.raises(AirflowFailException, match="where slices a resync"):
        choose(params={**slice_, "mode": "rebuild"})
    resync = pipeline_dags(Pipeline(**BASE))["pgcdc_backfill"].task_dict["resync"]
    assert resync.where == "{{ params.where }}" and "where" in resync.template_fields
