"""Airflow provider metadata (the ``apache_airflow_provider`` entry point)."""

from __future__ import annotations


def get_provider_info() -> dict:
    from airflow_pgcdc import package_version

    return {
        "package-name": "airflow-pgcdc",
        "name": "PostgreSQL CDC (airflow-pgcdc)",
        "description": "PostgreSQL snapshot-plus-CDC pipelines into Delta Lake on S3.",
        "versions": [package_version()],
        "integrations": [
            {
                "integration-name": "PostgreSQL CDC",
                "external-doc-url": "https://pypi.org/project/airflow-pgcdc/",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {"integration-name": "PostgreSQL CDC", "python-modules": ["airflow_pgcdc.hooks.pgcdc"]}
        ],
        "connection-types": [
            {"hook-class-name": "airflow_pgcdc.hooks.pgcdc.PgcdcHook", "connection-type": "pgcdc"}
        ],
        "operators": [
            {"integration-name": "PostgreSQL CDC", "python-modules": ["airflow_pgcdc.operators.snapshot", "airflow_pgcdc.operators.resync", "airflow_pgcdc.operators.recover", "airflow_pgcdc.operators.basebackup", "airflow_pgcdc.operators.drain", "airflow_pgcdc.operators.merge", "airflow_pgcdc.operators.verify", "airflow_pgcdc.operators.maintain"]}
        ],

        "sensors": [
            {"integration-name": "PostgreSQL CDC", "python-modules": ["airflow_pgcdc.sensors.changes"]}
        ],
        "triggers": [
            {"integration-name": "PostgreSQL CDC", "python-modules": ["airflow_pgcdc.triggers.changes"]}
        ],
    }
