"""The Spark merge: Delta tables bootstrapped from a snapshot and kept in step with the
change windows (see :mod:`.job`). Nothing here imports Airflow: the package is shipped
to Spark executors as a zip (``--py-files``)."""
