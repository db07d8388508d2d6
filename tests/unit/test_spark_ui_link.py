"""The merge task's "Spark UI" link (:func:`airflow_pgcdc.operators.links.spark_ui_link`)."""

from __future__ import annotations

from airflow_pgcdc.operators.links import spark_ui_link


def test_a_history_server_page_a_standalone_master_page_or_none():
    app = {"app_id": "app-20261130035959-0001", "master": "spark://10.0.0.5:7077"}
    assert spark_ui_link(app, "http://hist:18080/history/{app_id}/jobs/") == (
        "http://hist:18080/history/app-20261130035959-0001/jobs/")
    assert spark_ui_link(app) == "http://10.0.0.5:8080/app/?appId=app-20261130035959-0001"
    assert spark_ui_link({"app_id": "app-1", "master": "spark://m1:7077,m2:7077"}) == "http://m1:8080/app/?appId=app-1"
    assert spark_ui_link({"app_id": "local-1764", "master": "local[*]"}) == ""  # its UI ended with the job
    assert spark_ui_link({"app_id": "application_1_2", "master": "yarn"}) == ""
    assert spark_ui_link(None, "http://hist/{app_id}") == ""  # no application started
    assert spark_ui_link({"app_id": "a/b?c", "master": "local"}, "http://h/{app_id}") == "http://h/a%2Fb%3Fc"
