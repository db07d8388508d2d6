"""Data file sizes of the Delta tables: the target size the merge's bootstrap and resyncs
write and upkeep's compaction bins to (one default for both, so a compaction does not fold
the key-sorted files a bootstrap wrote)."""

from __future__ import annotations

__all__ = ["DEFAULT_TARGET_FILE_MB", "target_bytes"]


DEFAULT_TARGET_FILE_MB = 32.0
"""The data files' target size (MB of Parquet) at bootstrap: ``--target-file-mb``. A
table smaller than that is one file (no small files); see README "merge cost"."""


def target_bytes(target_mb: float) -> int:
    """``--target-file-mb`` in bytes (fractions allowed: the tests write tiny files)."""
    if not target_mb or target_mb <= 0:
        raise ValueError(f"the target file size must be positive, got {target_mb!r} MB")
    return max(1, int(float(target_mb) * 1024 * 1024))

