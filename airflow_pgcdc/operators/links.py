"""The merge operator's extra link: its Spark application in the Spark UI (``Spark UI`` on the
task's page). The task computes the link when it ends (Airflow 3 stores it in XCom under the
link's ``xcom_key``; the UI reads it from there), from the application the merge job reports
(``spark``: its id and master, :mod:`airflow_pgcdc.merge.spark_app`):

* ``spark_ui_url`` given (templated; ``{app_id}`` replaced): a Spark History Server's page,
  e.g. ``http://spark-history:18080/history/{app_id}/jobs/``;
* else, a standalone master ``spark://host:port``: the master's page of the application,
  ``http://host:8080/app/?appId=…`` (the master UI's default port);
* else (``local[*]``: its UI ends with the job; YARN, Kubernetes: their own consoles), and a
  run that started no Spark application (small batches on the driver): no link."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

__all__ = ["PgcdcSparkUILink", "spark_ui_link"]

MASTER_UI_PORT = 8080
"""A standalone master's web UI port (Spark's default, ``spark.master.ui.port``)."""


def spark_ui_link(spark: Mapping[str, Any] | None, template: str | None = None) -> str:
    """The link to the application ``spark`` (``{"app_id", "master"}``, or None), ``""`` when
    there is none (see the module)."""
    app = str((spark or {}).get("app_id") or "")
    if not app:
        return ""
    if template:
        return str(template).replace("{app_id}", quote(app, safe=""))
    master = str((spark or {}).get("master") or "")
    if master.startswith("spark://"):
        host = master[len("spark://"):].split(",")[0].rsplit(":", 1)[0]
        return f"http://{host}:{MASTER_UI_PORT}/app/?appId={quote(app, safe='')}"
    return ""


class PgcdcSparkUILink(BaseOperatorLink):
    """``Spark UI``: the merge task's Spark application (:func:`spark_ui_link`)."""

    name = "Spark UI"

    def get_link(self, operator, *, ti_key) -> str:
        # called in the task's process as it ends (Airflow 3 keeps the value in XCom)
        return str(getattr(operator, "spark_ui_link", "") or "")
