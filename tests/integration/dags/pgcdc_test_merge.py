"""Test DAG: the Spark merge submitted by ``PgcdcSparkMergeOperator`` (spark_default is
``local[*]`` or the test bed's Spark cluster in the test's environment; S3 from the
``pgcdc_s3`` connection; engine and reader from the run's conf: ``engine``/``reader`` for
both tasks, ``engine_rest``/``reader_rest`` for the second when given, ``null`` for the default).

No window numbers are handed over: each merge takes the committed windows not yet merged,
in order; ``merge_first`` at most ``conf['max_windows']`` of them, ``merge`` the rest.
"""

import datetime

from airflow.sdk import DAG

from airflow_pgcdc.operators.merge import PgcdcSparkMergeOperator

with DAG("pgcdc_test_merge", schedule=None, start_date=datetime.datetime(2024, 1, 1), catchup=False,
         render_template_as_native_obj=True) as dag:
    common = dict(
        store="{{ dag_run.conf['source'] }}",
        slot="{{ dag_run.conf['slot'] }}",
        delta="{{ dag_run.conf['delta'] }}",
        tables="{{ dag_run.conf.get('tables') }}",
        engine="{{ dag_run.conf.get('engine') }}",
        reader="{{ dag_run.conf.get('reader') }}",
        keys={"public.nokey": ["k"]},
        aws_conn_id="pgcdc_s3",
        driver_memory="1g",
    )
    # a bounded catch-up first (max_windows from the run's conf), then everything left
    first = PgcdcSparkMergeOperator(task_id="merge_first", max_windows="{{ dag_run.conf['max_windows'] }}",
                                    spark_ui_url="http://history.test:18080/history/{app_id}/jobs/", **common)
    rest = PgcdcSparkMergeOperator(task_id="merge", **{
        **common,
        "engine": "{{ dag_run.conf.get('engine_rest', dag_run.conf.get('engine')) }}",
        "reader": "{{ dag_run.conf.get('reader_rest', dag_run.conf.get('reader')) }}",
    })
    first >> rest
