"""What :func:`~airflow_pgcdc.verify.job.verify_table` is asked past the table and the key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_pgcdc.options import JobOptions
from airflow_pgcdc.verify.compare import DEFAULT_MAX_DIFFS

__all__ = ["DEFAULT_MAX_DIFFS", "VerifyOptions"]


@dataclass(frozen=True, kw_only=True)
class VerifyOptions(JobOptions):
    """``max_diffs``: keys shown per kind of difference; ``check_metadata``: also check the
    Delta table's CDC metadata columns; ``privacy``: the pipeline's column rules (a
    :class:`~airflow_pgcdc.store.privacy.SlotPrivacy`: ``resolve_privacy(client, layout,
    slot)``), applied to PostgreSQL's rows before they are compared."""

    job: ClassVar[str] = "the verification"

    max_diffs: int = DEFAULT_MAX_DIFFS
    check_metadata: bool = False
    privacy: Any = None
