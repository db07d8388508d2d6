"""Sans-IO implementation of the protocols in ``shared/spec``: bytes in, typed values out.

Nothing in this package touches a socket, psycopg or Airflow; it imports the
standard library only (and :mod:`airflow_pgcdc.errors`).
"""
