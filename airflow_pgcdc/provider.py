"""Airflow provider metadata (the ``apache_airflow_provider`` entry point)."""

from __future__ import annotations


def _text(label: str, description: str, *, secret: bool = False) -> dict:
    schema = {"type": ["string", "null"]} | ({"format": "password"} if secret else {})
    return {"label": label, "description": description, "schema": schema}


CONN_FIELDS = {
    # stored in the connection's extras under these names: the libpq parameters PgcdcHook
    # passes on (hooks/pgcdc.py LIBPQ_EXTRAS)
    "sslmode": {
        "label": "SSL mode", "description": "libpq sslmode: disable, allow, prefer, require, verify-ca, verify-full",
        "schema": {"type": ["string", "null"],
                   "enum": [None, "disable", "allow", "prefer", "require", "verify-ca", "verify-full"]},
    },
    "sslrootcert": _text("SSL root certificate", "path of the CA certificate(s) the server's must chain to "
                         "(or 'system'), on the workers"),
    "sslcert": _text("SSL client certificate", "path of the client certificate, on the workers"),
    "sslkey": _text("SSL client key", "path of the client certificate's key, on the workers"),
    "sslpassword": _text("SSL key password", "password of an encrypted client key", secret=True),
    "channel_binding": _text("Channel binding", "libpq channel_binding: disable, prefer, require (SCRAM over TLS)"),
    "require_auth": _text("Required authentication", "libpq require_auth, e.g. scram-sha-256"),
    "application_name": _text("Application name", "shown in pg_stat_activity and pg_stat_replication"),
}
"""The connection form's fields beyond host, port, login, password and database: libpq's
TLS and authentication settings (the Airflow UI shows them under the ``pgcdc`` type)."""


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
            {
                "hook-class-name": "airflow_pgcdc.hooks.pgcdc.PgcdcHook",
                "hook-name": "PostgreSQL CDC",
                "connection-type": "pgcdc",
                "ui-field-behaviour": {
                    "hidden-fields": [],
                    "relabeling": {"schema": "Database"},
                    "placeholders": {},
                },
                "conn-fields": CONN_FIELDS,
            }
        ],
        "operators": [
            {"integration-name": "PostgreSQL CDC", "python-modules": ["airflow_pgcdc.operators.snapshot", "airflow_pgcdc.operators.resync", "airflow_pgcdc.operators.recover", "airflow_pgcdc.operators.basebackup", "airflow_pgcdc.operators.drain", "airflow_pgcdc.operators.merge", "airflow_pgcdc.operators.rebuild", "airflow_pgcdc.operators.verify", "airflow_pgcdc.operators.maintain", "airflow_pgcdc.operators.freshness"]}
        ],

        "sensors": [
            {"integration-name": "PostgreSQL CDC", "python-modules": ["airflow_pgcdc.sensors.changes"]}
        ],
        "extra-links": ["airflow_pgcdc.operators.links.PgcdcSparkUILink"],
        "triggers": [
            {"integration-name": "PostgreSQL CDC", "python-modules": ["airflow_pgcdc.triggers.changes"]}
        ],
    }
