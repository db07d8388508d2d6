"""Every column name the pipeline itself puts beside the user's columns, in one place.

All start with ``_pgcdc_`` (the history columns of an SCD2 table with ``__``), so a user
column can clash with them only by that prefix: the drain refuses such a table alone
(:class:`~airflow_pgcdc.changes.rows.ColumnNameClash`), the merge refuses it alone.

- In the change parts of the store (the contract, ``docs/store-format.md``): the
  metadata columns and the old key values of a key-changing update or delete.
- In the merge's working frames only (never written to Delta): the batch compaction's
  and the keyless merge's helper columns.
- In an SCD2 history table (``--history scd2``): the validity columns.
- In the Delta tables, with ``--metadata-columns``: ``_pgcdc_op``, ``_pgcdc_commit_lsn``,
  ``_pgcdc_commit_ts`` and ``_pgcdc_merged_at`` (:mod:`airflow_pgcdc.merge.metadata`).
"""

from __future__ import annotations

PREFIX = "_pgcdc_"

# the change parts (store contract)
OP = "_pgcdc_op"
"""``I``, ``U`` or ``D``."""
COMMIT_LSN = "_pgcdc_commit_lsn"
SEQ = "_pgcdc_seq"
XID = "_pgcdc_xid"
COMMIT_TS = "_pgcdc_commit_ts"
UNCHANGED_TOAST = "_pgcdc_unchanged_toast"
OLD_PREFIX = "_pgcdc_old_"
"""``_pgcdc_old_<column>``: the old value of a replica-identity column."""

# the Delta tables' metadata columns (--metadata-columns; OP, COMMIT_LSN and COMMIT_TS too)
MERGED_AT = "_pgcdc_merged_at"
"""When the merge wrote the row's current values (:mod:`airflow_pgcdc.merge.metadata`)."""
DELETED_AT = "_pgcdc_deleted_at"
"""``--soft-deletes``: when the source deleted the row (NULL: a live row)."""

# the merge's working columns
KEEP_PREFIX = "_pgcdc_keep_"
MATCH_PREFIX = "_pgcdc_match_"
"""A rekeyed batch's ``_pgcdc_match_<k>``: the target key each row is matched on
(:func:`airflow_pgcdc.merge.compact.compact` with ``rekey``)."""
MOVED = "_pgcdc_moved"
MOVE_D = "_pgcdc_move_d"
"""The D row a key-changing update adds for its old key."""
FROM_PREFIX = "_pgcdc_from_"
"""A moved row's old key."""
KIND = "_pgcdc_kind"
"""The role of a MERGE source row: ``close``/``version`` (history), ``del``/``ins`` (keyless)."""
KEYLESS_DELTA, KEYLESS_SUB, KEYLESS_FULL, KEYLESS_RUN = "_pgcdc_delta", "_pgcdc_sub", "_pgcdc_full", "_pgcdc_run"
KEYLESS_SUM, KEYLESS_LOW, KEYLESS_HAVE, KEYLESS_COUNT = "_pgcdc_sum", "_pgcdc_low", "_pgcdc_have", "_pgcdc_n"
KEYLESS_CANON = "_pgcdc_v"
"""``_pgcdc_v<i>``: column i's value as the keyless merge compares it."""

# an SCD2 history table's columns
VALID_FROM, VALID_TO, IS_CURRENT, HIST_OP = "__valid_from_lsn", "__valid_to_lsn", "__is_current", "__op"
