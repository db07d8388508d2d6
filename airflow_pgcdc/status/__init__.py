"""The status job: :func:`.job.slot_status` (what ``pgcdc status`` shows), beside the other
jobs; it reads the store and the Delta tables and writes nothing."""
