"""Writing Delta tables, for the merge: :mod:`.base` (the :class:`~.base.DeltaSink`
interface every write goes through, and a commit's :class:`~.base.Commit`), :mod:`.engines`
(its two implementations, chosen once per job by ``--engine``), :mod:`.table` (one table's
bootstrap, resync replacement, MERGE of a batch and appends, through the job's sink),
:mod:`.deltars` (delta-rs' commits: the driver commits, from Arrow or from the files a Spark
job staged) and :mod:`.deltaspark` (Delta's Spark engine: the executors write, the driver
commits)."""
