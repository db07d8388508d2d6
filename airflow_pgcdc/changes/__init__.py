"""A decoded change stream → change rows: the relation cache (:mod:`.columns`), change rows
(:mod:`.rows`), transaction assembly (:mod:`.assembly`) and the spool of streamed
transactions (:mod:`.spool`). The row decoders it builds on (COPY and pgoutput TupleData →
Arrow) live with the type map, in :mod:`airflow_pgcdc.typemap.decode`.

Imports: ``protocol``, ``typemap``, pyarrow (and numpy, which pyarrow's conversions use) only.
"""
