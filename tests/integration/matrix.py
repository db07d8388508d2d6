"""Which PostgreSQL server a test runs against, when running every cell of a matrix would
test nothing more.

Most integration tests run on both servers (``pg_server``: 15 and 18), because the
server decides what the drain and the snapshot see. A test whose subject comes *after*
the store (the merge engines, the store readers, ``pgcdc maintain``) gets the same
windows from either server: running its whole server × engine product repeats each
engine's work twice for no new path. These helpers keep the cells where a path differs:

- :func:`on_pg18`: the test runs on PostgreSQL 18 alone (the merge side, no server
  difference); its server-dependent parts (the drain and snapshot that set it up) are
  tested on both servers by their own modules.
- :func:`servers_in_turn`: an engine (or reader) axis crossed with the servers pairwise:
  each value once, the servers alternating, so each server and each value still run
  (``pg15-delta-rs``, ``pg18-delta-spark``, ``pg15-delta-spark-s3a``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from _pytest.mark.structures import ParameterSet

SERVERS = ("pg15", "pg18")


def on_pg18(reason: str):
    """``pg_server`` is PostgreSQL 18 alone; ``reason`` says why the server does not matter."""
    assert reason, "say why the server does not matter"
    return pytest.mark.parametrize("pg_server", ["pg18"], indirect=True)


def servers_in_turn(argname: str, values: Sequence) -> pytest.MarkDecorator:
    """Parametrize ``pg_server`` and ``argname`` together: value *i* runs on server *i* mod 2.
    ``values`` may hold ``pytest.param`` (their marks and ids are kept)."""
    cells = []
    for i, v in enumerate(values):
        server = SERVERS[i % len(SERVERS)]
        if isinstance(v, ParameterSet):
            (value,), marks, vid = v.values, tuple(v.marks), v.id or str(v.values[0])
        else:
            value, marks, vid = v, (), str(v)
        cells.append(pytest.param(server, value, marks=(*marks, getattr(pytest.mark, server)),
                                  id=f"{server}-{vid}"))
    return pytest.mark.parametrize(("pg_server", argname), cells, indirect=["pg_server"])
