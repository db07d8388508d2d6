"""Decoded messages → change rows: the PostgreSQL → Arrow type map (shared with the
snapshot), and the converters built on it.

* :mod:`~airflow_pgcdc.changes.typemap`: the mapping (``arrow_field``/``arrow_schema``),
  errors, session settings, single-column converters and ``to_pg_text``;
* :mod:`~airflow_pgcdc.changes.snapshot_copy`: ``SnapshotDecoder`` for COPY CSV output;
* :mod:`~airflow_pgcdc.changes.tuples`: ``TupleDecoder`` for pgoutput TupleData;
* :mod:`~airflow_pgcdc.changes.codecs`: the per-type converters (internal).

Imports: ``protocol``, pyarrow (and numpy, which pyarrow's conversions use) only.
"""
