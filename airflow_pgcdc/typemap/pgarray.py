"""PostgreSQL arrays: the text form (``{...}``, quoting, dimensions) and the binary form
(``array_send``), as Arrow lists of the element type's codec.
"""

from __future__ import annotations

import math
import re
import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_pgcdc.typemap import arrays
from airflow_pgcdc.typemap.codec import _TRUE, BadValue, Codec, _any_true, _as_string, _OneBad, _str

# --------------------------------------------------------------------------- arrays


_ARRAY_SPACE = " \t\n\r\v\f"


def quote_array_element(text: str, delimiter: str = ",") -> str:
    """An element as ``array_out`` writes it (quoted when needed)."""
    if (
        text == ""
        or text.upper() == "NULL"
        or any(c in text for c in ('"', "\\", "{", "}", delimiter))
        or any(c in _ARRAY_SPACE for c in text)
    ):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def parse_array_text(text: str, delimiter: str = ",") -> tuple[list[int], list[int] | None, list[str | None]]:
    """``array_out`` text → (dimensions, lower bounds or None when all 1, flat elements).

    Elements are in row-major order, ``None`` for NULL; ``{}`` is ``([], None, [])``.
    """
    lbounds: list[int] | None = None
    pos = 0
    if text.startswith("["):
        eq = text.find("=")
        if eq < 0:
            raise _OneBad("array dimension decoration without '='")
        decoration = re.fullmatch(r"((?:\[-?\d+:-?\d+\])+)", text[:eq])
        if not decoration:
            raise _OneBad("bad array dimension decoration")
        bounds = [tuple(map(int, b)) for b in re.findall(r"\[(-?\d+):(-?\d+)\]", text[:eq])]
        lbounds = [lo for lo, _ in bounds]
        pos = eq + 1
    if pos >= len(text) or text[pos] != "{":
        raise _OneBad("array text must start with '{'")
    if pos == 0:
        flat = _parse_1d(text, delimiter)
        if flat is not None:
            return ([len(flat)] if flat else []), None, flat
    marks: list = []
    out: list[str | None] = []
    end = _parse_level(text, pos, 0, marks, out, delimiter)
    if end != len(text):
        raise _OneBad("junk after the array")
    dims: list[int] = [d for d in marks if d is not None and d >= 0]
    if marks and (marks[-1] != -1 or len(dims) != len(marks) - 1):
        raise _OneBad("elements at different depths")
    if lbounds is not None:
        if len(lbounds) != len(dims):
            raise _OneBad("array decoration does not match its dimensions")
        if all(lo == 1 for lo in lbounds):
            lbounds = None
    return dims, lbounds, out


_ONE_D: dict[str, tuple[re.Pattern, re.Pattern]] = {}
_UNESCAPE = re.compile(r"\\(.)", re.S)


def _parse_1d(text: str, delim: str) -> list[str | None] | None:
    """A 1-D array by regular expressions (None when ``text`` is not a plain 1-D array)."""
    pats = _ONE_D.get(delim)
    if pats is None:
        d = re.escape(delim)
        elem = rf'"(?:[^"\\]|\\.)*"|[^{d}"{{}}\\\s]+'
        whole = re.compile(rf"\{{(?:(?:{elem})(?:{d}(?:{elem}))*)?\}}", re.S)
        parts = re.compile(rf'"((?:[^"\\]|\\.)*)"|([^{d}"{{}}\\\s]+)', re.S)
        pats = _ONE_D[delim] = (whole, parts)
    whole, parts = pats
    if not whole.fullmatch(text):
        return None
    out: list[str | None] = []
    for quoted, bare in parts.findall(text, 1, len(text) - 1):
        if bare:
            out.append(None if bare == "NULL" else bare)
        else:
            out.append(_UNESCAPE.sub(r"\1", quoted) if "\\" in quoted else quoted)
    return out


def _parse_level(s: str, i: int, level: int, dims: list, out: list, delim: str) -> int:
    """Parse the sub-array starting at ``s[i] == "{"``; ``dims[level]`` gets its length.
    ``dims`` ends with a marker entry ``-1 - leaf_level`` once an element is seen."""
    i += 1
    n = len(s)
    count = 0
    if i < n and s[i] == "}":
        if level != 0:
            raise _OneBad("empty sub-array")
        return i + 1
    while True:
        if i >= n:
            raise _OneBad("unterminated array")
        c = s[i]
        if c == "{":
            i = _parse_level(s, i, level + 1, dims, out, delim)
        else:
            if c == '"':
                j = i + 1
                buf = []
                while True:
                    k = j
                    while k < n and s[k] != '"' and s[k] != "\\":
                        k += 1
                    if k >= n:
                        raise _OneBad("unterminated quoted array element")
                    buf.append(s[j:k])
                    if s[k] == '"':
                        i = k + 1
                        break
                    if k + 1 >= n:
                        raise _OneBad("unterminated escape in array element")
                    buf.append(s[k + 1])
                    j = k + 2
                out.append("".join(buf))
            else:
                j = i
                while j < n and s[j] != delim and s[j] != "}":
                    j += 1
                tok = s[i:j]
                if not tok or "{" in tok or '"' in tok:
                    raise _OneBad("malformed array element")
                out.append(None if tok == "NULL" else tok)
                i = j
            _set_dim(dims, level + 1, -1, "elements at different depths")
        count += 1
        if i >= n:
            raise _OneBad("unterminated array")
        if s[i] == delim:
            i += 1
            continue
        if s[i] == "}":
            i += 1
            break
        raise _OneBad(f"unexpected {s[i]!r} in array")
    _set_dim(dims, level, count, "ragged array (sub-arrays of different lengths)")
    return i


def _set_dim(dims: list, level: int, value: int, why: str) -> None:
    """Record ``dims[level] = value`` (value -1 marks the leaf level); a different value
    already there means the array is not rectangular."""
    while len(dims) <= level:
        dims.append(None)
    if dims[level] is None:
        dims[level] = value
    elif dims[level] != value:
        raise _OneBad(why)


class ArrayCodec(Codec):
    """Arrays → Arrow lists, nested ``depth`` deep (``ndims`` of the column, at least 1).

    NULL elements are list nulls; ``{}`` is an empty list. A value whose dimensions
    differ from the column's (``ndims``) or whose lower bounds are not 1 has no list
    form: it raises ``UnrepresentableValue`` (map the column ``as_text`` to keep such
    values as exact text).
    """

    encoding = "array"

    def __init__(self, type_, typmod, element: Codec, depth: int, delimiter: str):
        super().__init__(type_, typmod)
        self.element = element
        self.depth = max(depth, 1)
        self.delimiter = delimiter
        t = element.arrow_type
        for _ in range(self.depth):
            t = pa.list_(t)
        self.arrow_type = t
        self.binary_supported = element.binary_supported

    # ---- text
    def from_text(self, arr):
        arr = _as_string(arr)
        n = len(arr)
        if self.depth == 1 and n:
            fast = self._fast_1d(arr)
            if fast is not None:
                return fast
        parsed: list[tuple[list[int], list] | None] = [None] * n
        values = arr.to_pylist()
        for i, v in enumerate(values):
            if v is None:
                continue
            try:
                dims, lbounds, elems = parse_array_text(v, self.delimiter)
            except _OneBad as e:
                raise BadValue(i, e.reason, v) from None
            self._check_shape(i, v, dims, lbounds)
            parsed[i] = (dims, elems)
        return self._assemble(parsed, lambda flat: self.element.from_text(arrays.strings(flat)))

    def _check_shape(self, i: int, v: Any, dims: list[int], lbounds) -> None:
        if lbounds is not None:
            raise BadValue(
                i, "array with lower bounds other than 1 has no list form; map the column "
                "as_text to keep it", v, unrepresentable=True,
            )
        if dims and len(dims) != self.depth:
            raise BadValue(
                i, f"{len(dims)}-dimensional array in a column mapped with {self.depth} "
                "dimension(s); declare the column's dimensions (ndims) or map it as_text",
                v, unrepresentable=True,
            )

    def _fast_1d(self, arr: pa.Array) -> pa.Array | None:
        """1-D arrays without quoted elements: split with compute kernels."""
        ok = pc.and_(pc.starts_with(arr, "{"), pc.ends_with(arr, "}"))
        one = arrays.scalar(1, pa.int32())
        ok = pc.and_(ok, pc.equal(pc.count_substring(arr, "{"), one))
        ok = pc.and_(ok, pc.equal(pc.count_substring(arr, "}"), one))
        ok = pc.and_(ok, pc.invert(pc.match_substring(arr, '"')))
        if not pc.all(pc.fill_null(ok, _TRUE)).as_py():
            return None
        inner = pc.utf8_slice_codeunits(arr, 1, -1)
        empty = pc.equal(inner, _str(""))
        inner = pc.if_else(empty, _str(None), inner)
        lists = pc.split_pattern(inner, self.delimiter)
        flat = lists.flatten()
        flat = pc.if_else(pc.equal(flat, _str("NULL")), _str(None), flat)
        if _any_true(pc.equal(flat, _str(""))):
            return None  # malformed (empty unquoted element): let the parser say where
        offsets = _list_offsets(lists)
        try:
            typed = self.element.from_text(flat)
        except BadValue as e:
            row = int(np.searchsorted(offsets, e.index, side="right") - 1)
            raise BadValue(row, f"element {e.index - offsets[row] + 1}: {e.reason}", arr[row].as_py(),
                           unrepresentable=e.unrepresentable) from None
        mask = pc.is_null(arr)
        return pa.ListArray.from_arrays(arrays.from_numpy(offsets, pa.int32()), typed, type=self.arrow_type, mask=mask)

    def _assemble(self, parsed: list, convert) -> pa.Array:
        """Nested lists from per-row ``(dims, flat elements)`` (None = NULL row)."""
        flat: list = []
        row_starts = []
        for p in parsed:
            row_starts.append(len(flat))
            if p is not None:
                flat.extend(p[1])
        try:
            typed = convert(flat)
        except BadValue as e:
            row = int(np.searchsorted(np.array(row_starts), e.index, side="right") - 1)
            raise BadValue(row, f"element {e.index - row_starts[row] + 1}: {e.reason}", e.value,
                           unrepresentable=e.unrepresentable) from None
        # offsets level by level, outermost first
        level_offsets: list[list[int]] = [[0] for _ in range(self.depth)]
        for p in parsed:
            if p is None or not p[0]:
                level_offsets[0].append(level_offsets[0][-1])
                continue
            dims = p[0]
            count = 1
            for level in range(self.depth):
                offs = level_offsets[level]
                for _ in range(count):
                    offs.append(offs[-1] + dims[level])
                count *= dims[level]
        values = typed
        for level in range(self.depth - 1, -1, -1):
            t = self.element.arrow_type
            for _ in range(self.depth - level):
                t = pa.list_(t)
            mask = None
            if level == 0:
                mask = arrays.bools([p is None for p in parsed])
            values = pa.ListArray.from_arrays(
                arrays.ints(level_offsets[level], pa.int32()), values, type=t, mask=mask
            )
        return values

    # ---- binary
    def from_binary(self, values):
        parsed: list = []
        for i, v in enumerate(values):
            if v is None:
                parsed.append(None)
                continue
            try:
                dims, lbounds, elems = _parse_binary_array(bytes(v))
            except _OneBad as e:
                raise BadValue(i, e.reason, bytes(v)) from None
            self._check_shape(i, bytes(v), dims, None if all(lo == 1 for lo in lbounds) else lbounds)
            parsed.append((dims, elems))
        return self._assemble(parsed, self.element.from_binary)

    def binary_to_text(self, values: list) -> list[str | None]:
        """Binary arrays → exact ``array_out`` text, any shape (for ``as_text`` columns)."""
        shapes: list = []
        flat: list = []
        for i, v in enumerate(values):
            if v is None:
                shapes.append(None)
                continue
            try:
                dims, lbounds, elems = _parse_binary_array(bytes(v))
            except _OneBad as e:
                raise BadValue(i, e.reason, bytes(v)) from None
            shapes.append((dims, lbounds, len(flat), len(elems)))
            flat.extend(elems)
        texts = self.element.to_text(self.element.from_binary(flat)) if flat else []
        quoted = ["NULL" if t is None else quote_array_element(t, self.delimiter) for t in texts]
        out: list[str | None] = []
        for shape in shapes:
            if shape is None:
                out.append(None)
                continue
            dims, lbounds, start, count = shape
            if not dims:
                out.append("{}")
                continue
            deco = ""
            if any(lo != 1 for lo in lbounds):
                deco = "".join(f"[{lo}:{lo + d - 1}]" for lo, d in zip(lbounds, dims, strict=True)) + "="
            out.append(deco + _nest(quoted[start : start + count], dims, self.delimiter))
        return out

    # ---- back to text
    def to_text(self, arr):
        return self._format(arr, self.depth)

    def _format(self, arr: pa.Array, depth: int) -> list[str | None]:
        offsets = _list_offsets(arr)
        inner = arr.values.slice(offsets[0], offsets[-1] - offsets[0]) if len(arr) else arr.values.slice(0, 0)
        offsets = offsets - offsets[0]
        if depth == 1:
            texts = self.element.to_text(inner)
            elems = ["NULL" if t is None else quote_array_element(t, self.delimiter) for t in texts]
        else:
            elems = self._format(inner, depth - 1)
        valid = arr.is_valid().to_pylist()
        out: list[str | None] = []
        for r in range(len(arr)):
            if not valid[r]:
                out.append(None)
                continue
            items = elems[offsets[r] : offsets[r + 1]]
            out.append("{" + self.delimiter.join(items) + "}")
        return out


def _nest(items: list[str], dims: list[int], delim: str) -> str:
    if len(dims) == 1:
        return "{" + delim.join(items) + "}"
    step = len(items) // dims[0] if dims[0] else 0
    return "{" + delim.join(
        _nest(items[k * step : (k + 1) * step], dims[1:], delim) for k in range(dims[0])
    ) + "}"


def _list_offsets(arr: pa.Array) -> np.ndarray:
    offs = arrays.numpy_values(arr.offsets).astype(np.int64)
    return offs


def _parse_binary_array(v: bytes) -> tuple[list[int], list[int], list]:
    """``array_send`` bytes → (dims, lower bounds, flat element bytes)."""
    if len(v) < 12:
        raise _OneBad("binary array shorter than its header")
    ndim, flags, _elemtype = struct.unpack_from(">iiI", v)
    if ndim < 0 or ndim > 6 or flags not in (0, 1):
        raise _OneBad("malformed binary array header")
    pos = 12
    dims, lbounds = [], []
    for _ in range(ndim):
        if pos + 8 > len(v):
            raise _OneBad("binary array truncated in its dimensions")
        d, lo = struct.unpack_from(">ii", v, pos)
        if d < 0:
            raise _OneBad("negative array dimension")
        dims.append(d)
        lbounds.append(lo)
        pos += 8
    total = math.prod(dims) if dims else 0
    elems: list = []
    for _ in range(total):
        if pos + 4 > len(v):
            raise _OneBad("binary array truncated")
        (length,) = struct.unpack_from(">i", v, pos)
        pos += 4
        if length == -1:
            elems.append(None)
            continue
        if length < 0 or pos + length > len(v):
            raise _OneBad("binary array element length out of bounds")
        elems.append(v[pos : pos + length])
        pos += length
    if pos != len(v):
        raise _OneBad("trailing bytes after binary array")
    if total == 0:
        dims = []
    return dims, lbounds, elems
