"""PostgreSQL's two row encodings → Arrow, on the type map: the snapshot's COPY output, text
(:mod:`.copy_text`) and binary (:mod:`.copy_binary`), and pgoutput's TupleData
(:mod:`.tuples`, with ``_textcols.c``, the native cutter of raw Inserts into Arrow column
buffers). The change stream (:mod:`airflow_pgcdc.changes`) and the snapshot build on them."""
