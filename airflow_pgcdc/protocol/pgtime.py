"""PostgreSQL timestamps on the wire: microseconds since 2000-01-01 00:00:00 UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow_pgcdc.errors import InvalidFieldValue

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
PG_EPOCH_UNIX_US = 946_684_800_000_000
"""The PostgreSQL epoch in microseconds since the Unix epoch."""

_ONE_US = timedelta(microseconds=1)


def pg_us_to_datetime(us: int, *, protocol: str | None = None, what: str = "timestamp") -> datetime:
    """Convert wire microseconds to an aware UTC datetime; out-of-range values raise."""
    try:
        return PG_EPOCH + us * _ONE_US
    except OverflowError:
        raise InvalidFieldValue(
            f"{what} {us} us since 2000-01-01 is outside the representable range",
            protocol=protocol,
        ) from None


def datetime_to_pg_us(dt: datetime) -> int:
    """Convert an aware datetime to wire microseconds (naive datetimes are taken as UTC)."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    delta = dt - PG_EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def now_pg_us() -> int:
    """The current time as wire microseconds (for standby status updates)."""
    import time

    return time.time_ns() // 1000 - PG_EPOCH_UNIX_US
