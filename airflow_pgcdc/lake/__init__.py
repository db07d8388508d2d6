"""The Delta side every job shares, without Spark (the target layout's ``lake/``), below the
jobs and above the store:

* :mod:`.tables`: where a pipeline's Delta tables are (URLs under a Delta root, the history
  tables' suffixes) and their app transaction ids;
* :mod:`.inspect`: read-only views with delta-rs (open a table, what it holds of a slot's
  windows, who created it, its files, bytes and log);
* :mod:`.types`: Arrow types as Delta stores them, and back;
* :mod:`.sizing`: the data files' target size;
* :mod:`.sql`: the one identifier quoting function of the two engines' SQL;
* :mod:`.lock`: the lock a Delta root's merge and upkeep take so that they never commit over
  each other.

The merge writes the tables; maintain, verify, status and the rebuild read them through this
package, so no job imports another.
"""
