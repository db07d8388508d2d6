"""Test DAG: a merge in which one table fails and the others are merged.

``merge_strict`` (``on_failed_tables`` left at ``"fail"``) merges into ``conf['lake_strict']``;
``merge`` (``on_failed_tables="succeed"``) into ``conf['lake']``, followed by ``check``
(:class:`PgcdcMergeCheckOperator`), which fails naming the failed tables.
"""

import datetime

from airflow.sdk import DAG

from airflow_pgcdc.operators.merge import PgcdcMergeCheckOperator, PgcdcSparkMergeOperator

with DAG("pgcdc_test_merge_partial", schedule=None, start_date=datetime.datetime(2024, 1, 1), catchup=False,
         render_template_as_native_obj=True) as dag:
    common = dict(
        store="{{ dag_run.conf['source'] }}",
        slot="{{ dag_run.conf['slot'] }}",
        aws_conn_id="pgcdc_s3",
        driver_memory="1g",
    )
    strict = PgcdcSparkMergeOperator(task_id="merge_strict", delta="{{ dag_run.conf['lake_strict'] }}", **common)
    merge = PgcdcSparkMergeOperator(task_id="merge", delta="{{ dag_run.conf['lake'] }}",
                                    on_failed_tables="succeed", **common)
    check = PgcdcMergeCheckOperator(task_id="check", merge_task_id="merge")
    strict >> merge >> check
    merge.trigger_rule = "all_done"
