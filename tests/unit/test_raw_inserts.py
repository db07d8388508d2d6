"""Inserts kept as received and decoded in batches (TupleDecoder.decode_raw_inserts, the
drain's path for plain inserts) give exactly the batches of the decoded rows; anything
that path does not handle is declined (None) and decoded one by one. Every test runs on
both cutters of that path: the native splitter (airflow_pgcdc/typemap/decode/_textcols.c) and
the numpy one used where it is not built."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_pgcdc.changes.rows import ChangeBuffer, RelationVersion
from airflow_pgcdc.protocol import pgoutput as po
from airflow_pgcdc.protocol.pgtypes import PgColumn, builtin_type
from airflow_pgcdc.typemap.decode import tuples
from airflow_pgcdc.typemap.decode.tuples import TupleDecoder
from airflow_pgcdc.typemap.map import ValueConversionError

# int8, text, numeric, timestamptz, bool, float8, date, jsonb, varchar
OIDS = (20, 25, 1700, 1184, 16, 701, 1082, 3802, 1043)
COLUMNS = [PgColumn(f"c{i}", builtin_type(oid), -1) for i, oid in enumerate(OIDS)]
VALUE = {
    20: st.integers(-(2**63), 2**63 - 1).map(str),
    25: st.text(max_size=300),
    1700: st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-10**9, max_value=10**9).map(str),
    1184: st.sampled_from(["2026-11-25 12:00:00.123456+00", "1999-01-08 04:05:06+02", "infinity"]),
    16: st.sampled_from(["t", "f"]),
    701: st.floats(allow_nan=False, allow_infinity=False).map(repr),
    1082: st.sampled_from(["2020-01-01", "1970-12-31"]),
    3802: st.sampled_from(['{"k": 1}', '{"é": "ü"}', "[]"]),
    1043: st.text(alphabet=st.characters(codec="utf-8"), max_size=200),
}
ROW = st.tuples(*[st.one_of(st.none(), VALUE[oid]) for oid in OIDS])


NATIVE = tuples._textcols


@pytest.fixture(autouse=True, params=["native", "numpy"])
def cutter(request, monkeypatch):
    """Run the test with the native splitter, then with the numpy path."""
    if request.param == "numpy":
        monkeypatch.setattr(tuples, "_textcols", None)
    elif NATIVE is None:
        pytest.fail("the native splitter airflow_pgcdc.typemap.decode._textcols is not built: `make setup` builds "
                    "it (setup.py, needs a C compiler); without it the drain runs the slower numpy path")
    return request.param


def message(values, oid=16384) -> bytes:
    return po.Insert(None, oid, tuple(values)).encode(1)


@settings(max_examples=60, deadline=None)
@given(st.lists(ROW, min_size=1, max_size=40))
def test_raw_inserts_equal_decoded_rows(rows):
    dec = TupleDecoder(COLUMNS, table="public.t")
    got = dec.decode_raw_inserts([message(r) for r in rows])
    assert got is not None
    want = dec.decode(list(rows))
    assert got.batch.equals(want.batch)
    assert got.unchanged_toast.equals(want.unchanged_toast)



def test_values_around_the_string_views_inline_size():
    """Values of 0 to 20 bytes (a string view holds up to 12 itself, longer ones point into
    the buffer), multi-byte UTF-8 across the 12-byte edge, NULLs, the longest value last
    in the buffer: equal to the decoded rows."""
    cols = [COLUMNS[0], PgColumn("a", builtin_type(25), -1), PgColumn("b", builtin_type(25), -1)]
    rows = []
    for k in range(21):
        rows.append((str(k), "x" * k, None if k % 4 == 0 else "é" * (k // 2) + "z" * (k % 2)))
    rows.append(("99", "é" * 6, "ü" * 7))  # 12 and 14 bytes
    rows.append(("100", None, "€" * 40))
    dec = TupleDecoder(cols, table="public.t")
    got = dec.decode_raw_inserts([message(r) for r in rows])
    assert got is not None
    assert got.batch.equals(dec.decode(rows).batch)
    assert got.batch.column(1).to_pylist()[:21] == ["x" * k for k in range(21)]


def test_declined_messages_are_decoded_one_by_one():
    dec = TupleDecoder(COLUMNS[:2], table="public.t")
    ok = message(("1", "a"))
    assert dec.decode_raw_inserts([ok]) is not None
    binary = po.Insert(None, 1, (b"\x00" * 8, "a")).encode(1)
    toast = po.Insert(None, 1, ("1", po.UNCHANGED_TOAST)).encode(1)
    three = message(("1", "a", "x"))
    truncated = ok[:-1]
    longer = ok + b"x"
    latin1 = ok[:-1] + b"\xe9"  # not UTF-8
    not_insert = b"D" + ok[1:]
    for bad in (binary, toast, three, truncated, longer, latin1, not_insert, b"I"):
        assert dec.decode_raw_inserts([ok, bad]) is None, bad


def test_to_batch_of_raw_and_mixed_chunks_equals_decoded():
    rv = RelationVersion(16384, "public", "t", "d", tuple(COLUMNS[:3]), (True, False, False))
    rows = [("1", "é", "1.5"), ("2", None, None), ("3", "c", "-2.250")]
    raw_buf, dec_buf = ChangeBuffer(rv), ChangeBuffer(rv)
    for i, r in enumerate(rows):
        raw_buf.add_raw_insert(message(r), 100, i, 7, 5)
        dec_buf.add("I", r, None, 100, i, 7, 5, len(message(r)))
    assert raw_buf.nbytes == dec_buf.nbytes
    want = rv.to_batch(dec_buf.take())
    assert rv.to_batch(raw_buf.take()).equals(want)
    # a chunk with an update too: the raw inserts are decoded one by one
    mixed, plain = ChangeBuffer(rv), ChangeBuffer(rv)
    mixed.add_raw_insert(message(rows[0]), 100, 0, 7, 5)
    plain.add("I", rows[0], None, 100, 0, 7, 5)
    for b in (mixed, plain):
        b.add("U", ("1", "x", "2"), ("1", None, None), 100, 1, 7, 5)
    assert rv.to_batch(mixed.take()).equals(rv.to_batch(plain.take()))


def test_bad_value_is_reported_as_by_the_decoded_path():
    dec = TupleDecoder(COLUMNS[:1], table="public.t")
    with pytest.raises(ValueConversionError) as raw_err:
        dec.decode_raw_inserts([message(("1",)), message(("x",))], row_offset=10)
    with pytest.raises(ValueConversionError) as dec_err:
        dec.decode([("1",), ("x",)], row_offset=10)
    assert str(raw_err.value) == str(dec_err.value)


def test_empty_strings_and_all_nulls():
    dec = TupleDecoder(COLUMNS[:3], table="public.t")
    rows = [("1", "", None), ("2", "", None)]
    got = dec.decode_raw_inserts([message(r) for r in rows])
    assert got is not None and got.batch.equals(dec.decode(rows).batch)
    assert got.batch.column(2).null_count == 2


def update_message(values, oid=16384) -> bytes:
    return po.Update(None, oid, None, None, tuple(values)).encode(1)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("IU"), ROW), min_size=1, max_size=30))
def test_raw_updates_with_their_new_row_only_decode_like_inserts(changes):
    """An Update carrying only its new row (``U``, OID, ``N``) has an Insert's layout: a
    chunk of them, mixed with inserts, decodes in one batch to the decoded rows."""
    dec = TupleDecoder(COLUMNS, table="public.t")
    msgs = [message(r) if op == "I" else update_message(r) for op, r in changes]
    got = dec.decode_raw_inserts(msgs)
    assert got is not None
    assert got.batch.equals(dec.decode([r for _, r in changes]).batch)


def test_to_batch_of_raw_updates_equals_the_decoded_path():
    """ChangeBuffer.add_raw('U') then to_batch gives the batch of the decoded updates
    (old columns NULL, as for an update without an old key); an update with an unchanged
    TOAST value or an old key is declined by the batch path and decoded one by one."""
    cols = tuple(COLUMNS[:3])
    rv = RelationVersion(16384, "public", "t", "d", cols, (True, False, False))
    rows = [("1", "é", "1.5"), ("2", None, None), ("3", "c", "-2.250")]
    raw_buf, dec_buf = ChangeBuffer(rv), ChangeBuffer(rv)
    for i, r in enumerate(rows):
        op = "IUU"[i]
        m = message(r) if op == "I" else update_message(r)
        raw_buf.add_raw(m, op, 100, i, 7, 5)
        dec_buf.add(op, r, None, 100, i, 7, 5, len(m))
    assert raw_buf.nbytes == dec_buf.nbytes
    got = rv.to_batch(raw_buf.take())
    assert got.equals(rv.to_batch(dec_buf.take()))
    assert got.column("_pgcdc_op").to_pylist() == ["I", "U", "U"]
    # an unchanged TOAST value: the chunk is declined by decode_raw_inserts, decoded one by one
    toast = ("4", po.UNCHANGED_TOAST, "7")
    assert rv.decoder.decode_raw_inserts([update_message(toast)]) is None
    raw_buf.add_raw(update_message(toast), "U", 100, 3, 7, 5)
    dec_buf.add("U", toast, None, 100, 3, 7, 5)
    got = rv.to_batch(raw_buf.take())
    assert got.equals(rv.to_batch(dec_buf.take()))
    assert got.column("_pgcdc_unchanged_toast").to_pylist() == [["c1"]]
    # an update with its old key is never the batch path's
    keyed = po.Update(None, 16384, ("1", None, None), None, ("9", "a", "1")).encode(1)
    assert rv.decoder.decode_raw_inserts([keyed]) is None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ROW, min_size=1, max_size=12), st.data())
def test_both_cutters_agree_on_damaged_messages(cutter, rows, data):
    """A message with one byte changed, cut short or grown: the native splitter and the
    numpy path both decline it (None) or both give the same batch, never an exception of
    their own (a bad value is the codec's ValueConversionError, the same on both)."""
    if cutter == "numpy":
        return  # the comparison runs once, from the native parametrization
    dec = TupleDecoder(COLUMNS, table="public.t")
    msgs = [message(r) for r in rows]
    i = data.draw(st.integers(0, len(msgs) - 1))
    m = bytearray(msgs[i])
    how = data.draw(st.sampled_from(["byte", "cut", "grow"]))
    if how == "byte":
        m[data.draw(st.integers(0, len(m) - 1))] = data.draw(st.integers(0, 255))
    elif how == "cut":
        del m[data.draw(st.integers(0, len(m) - 1)):]
    else:
        m += bytes(data.draw(st.binary(min_size=1, max_size=6)))
    msgs[i] = bytes(m)
    results = []
    for impl in (NATIVE, None):
        tuples._textcols = impl
        try:
            got = dec.decode_raw_inserts(list(msgs))
            results.append(("batch", None if got is None else got.batch))
        except ValueConversionError as e:
            results.append(("error", str(e)))
        finally:
            tuples._textcols = NATIVE
    (k1, v1), (k2, v2) = results
    assert k1 == k2
    if k1 == "error" or v1 is None or v2 is None:
        assert v1 == v2 if k1 == "error" else (v1 is None and v2 is None)
    else:
        assert v1.equals(v2)


def test_native_splitter_buffers():
    """The splitter's own contract: per column, int32 offsets, the values end to end, a
    least-significant-bit-first validity bitmap only when a value is NULL."""
    if NATIVE is None:
        pytest.skip("the native splitter is not built (the cutter fixture fails for it)")
    msgs = [message(("1", "ab", None)), message(("22", "", "x")), message((None, "cde", None))]
    cols = NATIVE.split(msgs, 3)
    import array

    def ints(b):
        return list(array.array("i", b))

    (o0, d0, v0, n0), (o1, d1, v1, n1), (o2, d2, v2, n2) = cols
    assert (ints(o0), d0, v0, n0) == ([0, 1, 3, 3], b"122", bytes([0b011]), 1)
    assert (ints(o1), d1, v1, n1) == ([0, 2, 2, 5], b"abcde", None, 0)
    assert (ints(o2), d2, v2, n2) == ([0, 0, 1, 1], b"x", bytes([0b010]), 2)
    assert NATIVE.split(msgs, 2) is None  # the column count is the relation's
    assert NATIVE.split([], 3) == [(bytes(4), b"", None, 0)] * 3
    with pytest.raises(TypeError):
        NATIVE.split([memoryview(msgs[0])], 3)
