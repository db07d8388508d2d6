"""Defaults shared by the example DAGs: the embedded sandbox (``pgcdc sandbox up``).

Connections (set them in Airflow, or as ``AIRFLOW_CONN_*`` variables; ``make demo`` and
``pgcdc sandbox env --airflow`` print them for the sandbox):

* ``pgcdc_postgres``: the source database (type ``postgres``; extras ``sslmode``…);
* ``pgcdc_s3``: S3 (type ``aws``: login = access key id, password = secret key,
  extras ``endpoint_url``, ``region_name``);
* ``spark_default``: Spark (type ``spark``, host ``local[*]`` for the embedded default,
  your cluster's master otherwise).
"""

from airflow.sdk import Param

POSTGRES_CONN_ID = "pgcdc_postgres"
AWS_CONN_ID = "pgcdc_s3"
SPARK_CONN_ID = "spark_default"

PARAMS = {
    "slot": Param("pgcdc_demo", type="string", pattern="^[a-z0-9_]{1,63}$",
                  description="logical replication slot (created by the initial load)"),
    "publication": Param("pgcdc_demo_pub", type="string", description="publication to stream"),
    "tables": Param(["shop.customers", "shop.orders"], type="array",
                    description="schema.table names to publish, copy and merge"),
    "store": Param("s3://pgcdc/cdc", type="string", description="change store: s3://bucket/prefix"),
    "delta": Param("s3://pgcdc/delta", type="string", description="Delta root: s3://bucket/lake"),
}
