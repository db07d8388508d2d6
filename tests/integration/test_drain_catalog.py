"""The drain's catalog lookups of relation attributes (:class:`TypeResolver`), against real
PostgreSQL 15/18: with the publications given, the attributes of every relation they cover
are read in one go (two round trips) instead of one query per relation met, with the same
results; a Relation message whose shape changes, or whose columns the prefetched catalog
does not describe (DDL after it was read), still reads that relation alone (issue #15)."""

from __future__ import annotations

import psycopg

from airflow_pgcdc.drain import window as drain_window_module
from airflow_pgcdc.drain.window import TypeResolver

TABLES = 30


def _setup(db) -> None:
    with psycopg.connect(str(db), autocommit=True) as c:
        for i in range(TABLES):
            c.execute(f"CREATE TABLE t{i} (id bigint PRIMARY KEY, a int, b text)")
            c.execute(f"INSERT INTO t{i} VALUES (1, 1, 'x')")
        # the attributes the resolver reports: array dimensions, ADD COLUMN defaults
        # (attmissingval), columns a table rewrite filled
        c.execute("CREATE TABLE arr (id int PRIMARY KEY, xs int[], m text[][])")
        c.execute("CREATE TABLE miss (id int PRIMARY KEY)")
        c.execute("INSERT INTO miss VALUES (1)")
        c.execute("ALTER TABLE miss ADD COLUMN d int DEFAULT 42, ADD COLUMN s text DEFAULT 'a,b'")
        c.execute("CREATE TABLE rew (id int PRIMARY KEY)")
        c.execute("INSERT INTO rew VALUES (1)")
        c.execute("ALTER TABLE rew ADD COLUMN r float8 DEFAULT random()")
        c.execute("CREATE TABLE gen (id int PRIMARY KEY, a int)")
        c.execute("INSERT INTO gen VALUES (1, 1)")
        c.execute("ALTER TABLE gen ADD COLUMN g int GENERATED ALWAYS AS (a * 2) STORED")
        c.execute("CREATE TABLE outside (id int PRIMARY KEY, xs int[])")  # not published
        names = ", ".join([f"t{i}" for i in range(TABLES)] + ["arr", "miss", "rew", "gen"])
        c.execute(f"CREATE PUBLICATION pub FOR TABLE {names}")


def _oid(c, table: str) -> int:
    return c.execute("SELECT %s::regclass::oid::bigint", (table,)).fetchone()[0]


def _shape(c, table: str) -> tuple:
    """What a Relation message of ``table`` carries, as WindowSink passes it to refresh()."""
    cols = c.execute(
        "SELECT attname::text, atttypid::bigint, atttypmod FROM pg_attribute WHERE attrelid = %s::regclass "
        "AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (table,)).fetchall()
    return ("d", tuple((n, t, m, n == "id") for n, t, m in cols))


def _lookup(types: TypeResolver, c, table: str) -> tuple:
    oid = _oid(c, table)
    types.refresh(oid, _shape(c, table))
    return types.dims(oid), types.missing_values(oid), types.rewritten(oid)


def test_attributes_of_all_published_relations_in_one_go(fresh_db):
    _setup(fresh_db)
    tables = [f"t{i}" for i in range(TABLES)] + ["arr", "miss", "rew", "gen", "outside"]
    with psycopg.connect(str(fresh_db), autocommit=True) as c:
        one_by_one = TypeResolver(c)
        batched = TypeResolver(c, ("pub",))
        for t in tables:
            assert _lookup(batched, c, t) == _lookup(one_by_one, c, t), t
        assert one_by_one.queries == len(tables)
        # the prefetch's two round trips, and one for the unpublished table
        assert batched.queries == 3
        assert _lookup(batched, c, "arr")[0] == {"xs": 1, "m": 2}
        assert _lookup(batched, c, "miss")[1] == {"d": "42", "s": "a,b"}
        assert set(_lookup(batched, c, "rew")[2]) == {"r"}
        assert set(_lookup(batched, c, "gen")[2]) == {"g"}
        assert batched.queries == 3  # cached: no query for a relation already read


def test_a_new_shape_reads_the_relation_again(fresh_db):
    _setup(fresh_db)
    with psycopg.connect(str(fresh_db), autocommit=True) as c:
        types = TypeResolver(c, ("pub",))
        assert _lookup(types, c, "t1")[1] == {}
        assert _lookup(types, c, "t2")[1] == {}
        assert types.queries == 2
        # DDL while the drain runs, on a relation already met: its next Relation message
        # has another shape, and the relation alone is read again
        c.execute("ALTER TABLE t1 ADD COLUMN z int DEFAULT 7")
        assert _lookup(types, c, "t1")[1] == {"z": "7"}
        assert types.queries == 3
        # ... and on one not met yet, after the prefetch: its prefetched attributes lack
        # the new column, so they are not used
        c.execute("ALTER TABLE t3 ADD COLUMN w text[] DEFAULT '{q}'")
        c.execute("ALTER TABLE t4 ALTER COLUMN a TYPE bigint")
        c.execute("ALTER TABLE t4 ADD COLUMN v int DEFAULT 5")
        assert _lookup(types, c, "t3")[0] == {"w": 1}
        assert _lookup(types, c, "t4")[1] == {"v": "5"}
        assert types.queries == 5
        # an unchanged relation met later still comes from the prefetch
        assert _lookup(types, c, "t5") == ({}, {}, {})
        assert types.queries == 5
        # the same shape again: nothing read
        assert _lookup(types, c, "t1")[1] == {"z": "7"}
        assert types.queries == 5


def test_too_many_relations_reads_each_alone(fresh_db, monkeypatch):
    _setup(fresh_db)
    monkeypatch.setattr(drain_window_module, "PREFETCH_MAX_RELATIONS", 5)
    with psycopg.connect(str(fresh_db), autocommit=True) as c:
        types = TypeResolver(c, ("pub",))
        for t in ("t1", "t2", "miss"):
            _lookup(types, c, t)
        assert types.queries == 1 + 3  # the count of the publications' relations, then one each
        assert _lookup(types, c, "miss")[1] == {"d": "42", "s": "a,b"}


def test_drain_reads_the_catalog_once_for_many_tables(fresh_db, slot_name, s3, s3_bucket, monkeypatch):
    """A real window touching every table, with DDL on one of them inside the window."""
    from airflow_pgcdc.drain.drain import drain_window

    _setup(fresh_db)
    slot = slot_name()
    with psycopg.connect(str(fresh_db), autocommit=True) as c:
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        for i in range(TABLES):
            c.execute(f"INSERT INTO t{i} VALUES (2, 2, 'y')")
        c.execute("INSERT INTO arr VALUES (1, '{1,2}', '{{a,b},{c,d}}')")
        c.execute("ALTER TABLE t0 ADD COLUMN late int DEFAULT 9")
        c.execute("INSERT INTO t0 VALUES (3, 3, 'z', 10)")
    made: list[TypeResolver] = []
    original = TypeResolver.__init__

    def spy(self, *a, **kw):
        original(self, *a, **kw)
        made.append(self)

    monkeypatch.setattr(TypeResolver, "__init__", spy)
    r = drain_window(str(fresh_db), f"s3://{s3_bucket}/lake", slot=slot, publications="pub",
                     s3=s3.client(), max_wait=30, start_without_snapshot=True)
    assert r.rows == TABLES + 2
    types = made[-1]
    assert types.queries == 3  # the prefetch's two, and t0 alone for its second shape
    assert types.missing[_oid_of(fresh_db, "t0")] == {"late": "9"}
    assert types.ndims[_oid_of(fresh_db, "arr")] == {"xs": 1, "m": 2}


def _oid_of(db, table: str) -> int:
    with psycopg.connect(str(db), autocommit=True) as c:
        return _oid(c, table)
