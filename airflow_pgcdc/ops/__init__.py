"""Library calls for running a pipeline: :mod:`.status` (what ``pgcdc status`` shows)."""
