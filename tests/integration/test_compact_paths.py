"""The driver's compaction (merge/rows/arrow.py) against Spark's (merge/compact.py): the same
random batches of change rows through both, equal results required. The batches are
built to hit every rule: few keys (so keys collide), key-changing updates (moves, swaps
inside one transaction), unchanged TOAST values, deletes, truncates, REPLICA IDENTITY FULL
or not, rekey on and off, NULLs, NaN and a timestamp Python cannot hold."""

from __future__ import annotations

import math
import random

import pyarrow as pa
import pytest

from airflow_pgcdc.changes.columns import (
    COMMIT_LSN,
    MATCH_PREFIX,
    OLD_PREFIX,
    OP,
    SEQ,
    UNCHANGED_TOAST,
)
from airflow_pgcdc.merge.clauses import keep_column
from airflow_pgcdc.merge.compact import compact
from airflow_pgcdc.merge.rows.arrow import NotOnDriver, compact_table

pytestmark = pytest.mark.integration

COLS = ["b", "id", "t", "n", "f", "ts"]
KEYS = ["b", "id"]  # b: the random history's number; many histories go through one Spark job
TOAST_COLS = ["t"]
TYPES = {"b": pa.int32(), "id": pa.int64(), "t": pa.string(), "n": pa.int32(), "f": pa.float64(),
         "ts": pa.timestamp("us", tz="UTC")}


class _History:
    """Random changes of one table's rows (key ``(b, id)``, ``b`` fixed), as the drain writes
    them: inserts, updates (same key or moved, a TOAST value unsent or not), deletes, and
    under FULL swaps of two keys inside one transaction (a DEFERRABLE key)."""

    def __init__(self, rng: random.Random, b: int, full: bool, out: list[dict]) -> None:
        self.rng, self.b, self.full, self.out = rng, b, full, out
        self.state: dict[int, dict] = {}
        self.ids = rng.randint(2, 8)

    def _row(self, op, values, old, toast, lsn, seq):
        olds = COLS if self.full else KEYS
        self.out.append({**values, **{OLD_PREFIX + c: old.get(c) for c in olds},
                         OP: op, COMMIT_LSN: lsn, SEQ: seq, UNCHANGED_TOAST: toast})

    def _old(self, key: int) -> dict:
        return dict(self.state[key]) if self.full else {"b": self.b, "id": key}

    def step(self, lsn: int, seq: int) -> int:
        rng = self.rng
        values = {"b": self.b, "id": rng.randint(1, self.ids), "t": rng.choice(["a", "b", None, "long" * 3]),
                  "n": rng.choice([1, 2, None]), "f": rng.choice([0.0, -0.0, 1.5, math.nan, None]),
                  "ts": rng.choice([0, 1, None])}
        kind = rng.random()
        if self.full and len(self.state) >= 2 and kind < 0.15:  # UPDATE t SET id = a + b - id
            a, c = rng.sample(sorted(self.state), 2)
            ra, rc = self.state[a], self.state[c]
            self._row("U", {**ra, "id": c}, self._old(a), [], lsn, seq)
            self._row("U", {**rc, "id": a}, self._old(c), [], lsn, seq + 1)
            self.state[a], self.state[c] = {**rc, "id": a}, {**ra, "id": c}
            return seq + 2
        if kind < 0.4 or not self.state:
            self._row("I", values, {}, [], lsn, seq)
            self.state[values["id"]] = values
            return seq + 1
        prev = rng.choice(sorted(self.state))
        if kind < 0.85:
            if rng.random() < 0.5:
                values["id"] = prev
            toast = []
            if rng.random() < 0.4:
                toast, values["t"] = ["t"], None
            moved = values["id"] != prev
            self._row("U", values, self._old(prev) if (moved or self.full) else {}, toast, lsn, seq)
            kept = {**values, "t": self.state[prev]["t"]} if toast else values
            self.state.pop(prev)
            self.state[values["id"]] = kept
            return seq + 1
        gone = self._old(prev) if self.full else {"b": self.b, "id": prev}
        self._row("D", {c: gone.get(c) for c in COLS}, {}, [], lsn, seq)
        self.state.pop(prev)
        return seq + 1


def _batch(rng: random.Random, *, full: bool, histories: int) -> tuple[pa.Table, tuple[int, int] | None]:
    rows: list[dict] = []
    tables = [_History(rng, b, full, rows) for b in range(histories)]
    lsn, seq = 1000, 0
    for _ in range(histories * 12):
        if rng.random() < 0.3:  # a new transaction
            lsn += rng.randint(1, 50)
        seq = rng.choice(tables).step(lsn, seq + 1)
    truncate_at = None
    if rng.random() < 0.5:
        at = rows[rng.randrange(len(rows))]
        truncate_at = (at[COMMIT_LSN], at[SEQ])
    fields = [pa.field(c, TYPES[c]) for c in COLS]
    fields += [pa.field(OLD_PREFIX + c, TYPES[c]) for c in (COLS if full else KEYS)]
    fields += [pa.field(OP, pa.string()), pa.field(COMMIT_LSN, pa.int64()), pa.field(SEQ, pa.int64()),
               pa.field(UNCHANGED_TOAST, pa.list_(pa.string()))]
    return pa.table([pa.array([r.get(f.name) for r in rows], f.type) for f in fields], schema=pa.schema(fields)), \
        truncate_at


def _normal(table: pa.Table) -> list[tuple]:
    """Rows as sortable tuples (NaN as a string: equal to itself)."""
    out = []
    for r in table.to_pylist():
        out.append(tuple((k, "NaN" if isinstance(v, float) and math.isnan(v) else v) for k, v in sorted(r.items())))
    return sorted(out, key=repr)


@pytest.mark.parametrize("full", [False, True], ids=["key-identity", "full-identity"])
@pytest.mark.parametrize("rekey", [False, True], ids=["plain", "rekey"])
@pytest.mark.parametrize("seed", [1, 2])
def test_driver_compaction_equals_spark_on_random_batches(spark, full, rekey, seed):
    rng = random.Random(f"{seed}-{full}-{rekey}")
    table, truncate_at = _batch(rng, full=full, histories=40)
    args = dict(table_columns=COLS, key_columns=KEYS, toast_columns=TOAST_COLS, truncate_at=truncate_at,
                rekey=rekey)
    local = compact_table(table, **args)
    theirs = compact(spark.createDataFrame(table), **args).toArrow()
    expected = COLS + [OP, COMMIT_LSN, SEQ, keep_column("t")] + [MATCH_PREFIX + k for k in KEYS if rekey]
    assert local.column_names == expected
    assert _normal(local) == _normal(theirs.select(expected))


def test_driver_compaction_keeps_values_python_cannot_hold():
    """A ``+infinity`` timestamp (PostgreSQL's, beyond Python's year 9999) passes through by
    index; a key of such values is compared as its integer."""
    big = 2**62
    table = pa.table({
        "id": pa.array([big, big], pa.timestamp("us", tz="UTC")),
        OLD_PREFIX + "id": pa.array([None, None], pa.timestamp("us", tz="UTC")),
        "v": pa.array([big - 1, big - 2], pa.timestamp("us", tz="UTC")),
        OP: ["I", "U"], COMMIT_LSN: pa.array([1, 2], pa.int64()), SEQ: pa.array([1, 2], pa.int64()),
        UNCHANGED_TOAST: pa.array([[], []], pa.list_(pa.string())),
    })
    out = compact_table(table, table_columns=["id", "v"], key_columns=["id"])
    assert out.num_rows == 1
    assert out["v"].cast(pa.int64()).to_pylist() == [big - 2]
    assert out[OP].to_pylist() == ["U"]


def test_driver_compaction_refuses_what_it_cannot_compare():
    """A key Python cannot hold as a value (a decimal beyond its context is fine; a nested
    timestamp beyond year 9999 is not) sends the batch to Spark, never a wrong answer."""
    big = 2**62
    key_type = pa.list_(pa.timestamp("us"))
    table = pa.table({
        "k": pa.array([[big]], key_type), OLD_PREFIX + "k": pa.array([None], key_type),
        OP: ["I"], COMMIT_LSN: pa.array([1], pa.int64()), SEQ: pa.array([1], pa.int64()),
        UNCHANGED_TOAST: pa.array([[]], pa.list_(pa.string())),
    })
    with pytest.raises(NotOnDriver):
        compact_table(table, table_columns=["k"], key_columns=["k"])
