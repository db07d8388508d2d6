"""Can this connection feed a pipeline? One catalog query on an ordinary connection: the
server's version, ``wal_level``, whether the role may replicate, and the replication slots
still free. What a connection test (the Airflow UI's Test button, ``airflow connections
test``) reports before anyone creates a slot.

A role may replicate when it has ``REPLICATION`` or is a superuser, or on Amazon RDS and
Aurora when it is a member of ``rds_replication`` (their master user has neither
attribute; the server still refuses a slot to anyone else).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg

from airflow_pgcdc.protocol.quoting import quote_ident

__all__ = ["Readiness", "logical_readiness"]

_QUERY = """
SELECT current_setting('server_version'),
       current_setting('server_version_num')::int,
       current_setting('wal_level'),
       current_user,
       r.rolsuper OR r.rolreplication
         OR (EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rds_replication')
             AND pg_has_role(current_user, 'rds_replication', 'member')),
       current_setting('max_replication_slots')::int,
       (SELECT count(*) FROM pg_replication_slots)::int,
       current_setting('max_wal_senders')::int
FROM pg_roles r
WHERE r.rolname = current_user
"""


@dataclass(frozen=True)
class Readiness:
    """What :func:`logical_readiness` found; ``problems`` empty means ready."""

    server_version: str
    server_version_num: int
    wal_level: str
    user: str
    can_replicate: bool
    free_slots: int
    max_wal_senders: int
    problems: list[str] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """One line for a connection test."""
        if self.problems:
            return "; ".join(self.problems)
        return (f"PostgreSQL {self.server_version}: wal_level logical, role {self.user} may replicate, "
                f"{self.free_slots} replication slot(s) free")


def logical_readiness(conn: psycopg.Connection | str) -> Readiness:
    """Check a connection (or DSN) for logical replication: PostgreSQL 15+ (what the product
    supports), ``wal_level = logical``, a role that may replicate, a free replication slot
    and at least one WAL sender."""
    if isinstance(conn, str):
        with psycopg.connect(conn, autocommit=True, connect_timeout=10) as c:
            return logical_readiness(c)
    row = conn.execute(_QUERY).fetchone()
    version, num, wal_level, user, can_replicate, max_slots, used_slots, senders = row
    problems = []
    if num < 150000:
        problems.append(f"PostgreSQL {version} is older than 15, the oldest version airflow-pgcdc supports")
    if wal_level != "logical":
        problems.append(f"wal_level is {wal_level!r}, not 'logical' (ALTER SYSTEM SET wal_level = logical, "
                        "then restart the server; on RDS set rds.logical_replication = 1)")
    if not can_replicate:
        role = quote_ident(user)
        problems.append(f"role {user} may not replicate (ALTER ROLE {role} REPLICATION; on RDS "
                        f"GRANT rds_replication TO {role})")
    free = max_slots - used_slots
    if free <= 0:
        problems.append(f"no free replication slot: {used_slots} of max_replication_slots = {max_slots} in use")
    if senders <= 0:
        problems.append("max_wal_senders is 0: no replication connection can be made")
    return Readiness(server_version=version, server_version_num=num, wal_level=wal_level, user=user,
                     can_replicate=bool(can_replicate), free_slots=free, max_wal_senders=senders,
                     problems=problems)
