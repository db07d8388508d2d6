"""The Delta side every job shares, without Spark (the target layout's ``lake/``):
:mod:`.lock`, the lock a Delta root's merge and upkeep take so that they never commit over
each other."""
