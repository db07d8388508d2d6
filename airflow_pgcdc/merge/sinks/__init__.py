"""Writing Delta tables, for the merge: :mod:`.table` (one table's bootstrap, resync
replacement, MERGE of a batch and appends, either engine), :mod:`.deltars` (delta-rs: the
driver commits, from Arrow or from the files a Spark job staged) and :mod:`.deltaspark`
(Delta's Spark engine: the executors write, the driver commits)."""
