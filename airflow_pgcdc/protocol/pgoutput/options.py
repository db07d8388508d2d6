"""The client side of pgoutput: which protocol version to ask for, and the
START_REPLICATION option list (``proto_version``, ``publication_names``, ``binary``,
``messages``, ``streaming``, ``two_phase``, ``origin``).

Server support, from PostgreSQL's pgoutput.c:
- proto_version 1 (10+), 2 (14+, streaming), 3 (15+, two-phase), 4 (16+, parallel
  streaming; with ``streaming 'parallel'`` Stream Abort carries its LSN and time).
- ``binary`` 14+, ``messages`` 14+, ``streaming`` boolean on 14–15 and
  ``off|on|parallel`` on 16+, ``two_phase`` 15+, ``origin`` ``none|any`` 16+.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airflow_pgcdc.errors import PgcdcError
from airflow_pgcdc.protocol.quoting import quote_ident


class UnsupportedOption(PgcdcError, ValueError):
    """An option the server version cannot honour."""


def max_proto_version(server_version: int, *, two_phase: bool = False) -> int:
    """The highest pgoutput protocol version worth asking ``server_version`` for.

    v4 on 16+; v3 on 15 (needed for two-phase; v2 otherwise, which streams the same);
    v2 on 14; v1 before.
    """
    if server_version >= 160000:
        return 4
    if server_version >= 150000:
        return 3 if two_phase else 2
    if server_version >= 140000:
        return 2
    return 1


@dataclass(frozen=True, slots=True)
class PgoutputOptions:
    """What we ask pgoutput for. ``proto_version=None`` means "negotiate"."""

    publications: tuple[str, ...]
    proto_version: int | None = None
    binary: bool = False
    messages: bool = False
    streaming: str = "off"  # off | on | parallel
    two_phase: bool = False
    origin: str | None = None  # none | any (16+)

    def __post_init__(self) -> None:
        if not self.publications:
            raise UnsupportedOption("pgoutput needs at least one publication")
        if self.streaming not in ("off", "on", "parallel"):
            raise UnsupportedOption(f"streaming must be off, on or parallel, not {self.streaming!r}")
        if self.origin not in (None, "none", "any"):
            raise UnsupportedOption(f"origin must be 'none' or 'any', not {self.origin!r}")
        if self.proto_version is not None and not 1 <= self.proto_version <= 4:
            raise UnsupportedOption(f"pgoutput protocol versions are 1 to 4, not {self.proto_version}")

    def resolve(self, server_version: int) -> PgoutputOptions:
        """Fill in the protocol version and check every option against the server."""
        version = self.proto_version or max_proto_version(server_version, two_phase=self.two_phase)
        if version > max_proto_version(server_version, two_phase=True):
            raise UnsupportedOption(
                f"pgoutput protocol version {version} needs a newer server than {server_version}"
            )
        needs = []
        if self.streaming != "off" and version < 2:
            needs.append("streaming needs protocol version 2 (PostgreSQL 14+)")
        if self.streaming == "parallel" and version < 4:
            needs.append("streaming 'parallel' needs protocol version 4 (PostgreSQL 16+)")
        if self.two_phase and version < 3:
            needs.append("two_phase needs protocol version 3 (PostgreSQL 15+)")
        if (self.binary or self.messages) and server_version < 140000:
            needs.append("binary and messages need PostgreSQL 14+")
        if self.origin is not None and server_version < 160000:
            needs.append("origin needs PostgreSQL 16+")
        if needs:
            raise UnsupportedOption("; ".join(needs))
        return PgoutputOptions(
            publications=self.publications,
            proto_version=version,
            binary=self.binary,
            messages=self.messages,
            streaming=self.streaming,
            two_phase=self.two_phase,
            origin=self.origin,
        )

    @property
    def parallel_streaming(self) -> bool:
        return self.streaming == "parallel"

    def start_options(self, server_version: int) -> list[tuple[str, str]]:
        """The (name, value) pairs for ``START_REPLICATION ... LOGICAL ... (...)``."""
        r = self.resolve(server_version)
        opts = [
            ("proto_version", str(r.proto_version)),
            ("publication_names", publication_names_value(r.publications)),
        ]
        if r.binary:
            opts.append(("binary", "true"))
        if r.messages:
            opts.append(("messages", "true"))
        if r.streaming != "off":
            # 14/15 take a boolean, 16+ off|on|parallel
            opts.append(("streaming", r.streaming if server_version >= 160000 else "true"))
        if r.two_phase:
            opts.append(("two_phase", "true"))
        if r.origin is not None:
            opts.append(("origin", r.origin))
        return opts


def publication_names_value(publications: Sequence[str]) -> str:
    """pgoutput splits ``publication_names`` with SplitIdentifierString: each name is
    an identifier, so each is quoted (commas, quotes and case survive)."""
    return ",".join(quote_ident(p) for p in publications)
