"""Decoded messages → change rows, and the converters built on the type map
(:mod:`airflow_pgcdc.typemap`: the mapping, errors, session settings, single-column
converters and ``to_pg_text``; its codecs, one module per type family).

* :mod:`~airflow_pgcdc.changes.snapshot_copy`: ``SnapshotDecoder`` for COPY CSV output;
* :mod:`~airflow_pgcdc.changes.copy_binary`: the decoder of COPY binary output;
* :mod:`~airflow_pgcdc.changes.tuples`: ``TupleDecoder`` for pgoutput TupleData;
* :mod:`~airflow_pgcdc.changes.rows`, :mod:`~airflow_pgcdc.changes.assembly`: change rows
  and transaction assembly.

Imports: ``protocol``, ``typemap``, pyarrow (and numpy, which pyarrow's conversions use) only.
"""
