"""PostgreSQL type descriptors: what a column's type is, independent of any I/O.

Shared by ``pg.catalog`` (which builds them from the catalogs) and ``typemap``
(which maps them to Arrow): both layers sit on ``protocol``, so the descriptor lives
here, stdlib only.

* :class:`PgTypeInfo` describes one type, with what the type map needs resolved:
  a domain's base type (through nested domains) with its typmod, an array's element
  type, an enum's labels, a composite's attributes, a range's (or multirange's)
  subtype.
* :class:`PgColumn` is a column as the type map sees it: name, type, typmod (as in
  ``pg_attribute.atttypmod`` or a pgoutput Relation message) and options.
* :data:`BUILTIN_TYPES` holds the built-in types of PostgreSQL 15-18 that a table
  column can have, so a change stream needs no catalog query for them (pgoutput sends
  Type messages only for types with OIDs >= 16384, and then only namespace and name).
* :func:`format_type` renders ``int4``, ``numeric(12,2)``, ``varchar(20)[]``,
  ``timestamptz(3)``, ``public.mood``: the ``pg_type`` written into Arrow metadata.
"""

from __future__ import annotations

from dataclasses import dataclass

FIRST_NORMAL_OID = 16384
"""OIDs below this are assigned at initdb (built-in objects)."""

VARHDRSZ = 4


@dataclass(frozen=True, slots=True)
class PgAttribute:
    """One attribute of a composite type (``pg_attribute`` of its ``typrelid``)."""

    name: str
    type: PgTypeInfo
    typmod: int = -1


@dataclass(frozen=True, slots=True)
class PgTypeInfo:
    """One PostgreSQL type, with the types it is built from resolved.

    ``kind`` is ``pg_type.typtype``: ``b`` base, ``c`` composite, ``d`` domain, ``e``
    enum, ``p`` pseudo, ``r`` range, ``m`` multirange. ``category`` is
    ``typcategory`` (``A`` array, ``N`` numeric, ``S`` string, ...). ``delimiter``
    is ``typdelim``: the separator between elements in the text form of an array of
    this type (``;`` for ``box``).

    * arrays (``kind == "b"`` with ``element`` set): the element type. Only true
      varlena arrays get ``element``; ``int2vector``/``oidvector``/``point`` do not.
    * domains: ``base`` is the fully resolved base type (never itself a domain),
      ``base_typmod``/``base_ndims`` the domain's ``typtypmod``/``typndims``.
    * enums: ``labels`` in sort order. Composites: ``attributes``. Ranges: ``subtype``;
      multiranges: ``range`` (the range type) and ``subtype``.
    """

    oid: int
    name: str
    schema: str = "pg_catalog"
    kind: str = "b"
    category: str = "U"
    delimiter: str = ","
    element: PgTypeInfo | None = None
    base: PgTypeInfo | None = None
    base_typmod: int = -1
    base_ndims: int = 0
    labels: tuple[str, ...] = ()
    attributes: tuple[PgAttribute, ...] = ()
    subtype: PgTypeInfo | None = None
    range: PgTypeInfo | None = None

    @property
    def is_array(self) -> bool:
        return self.element is not None

    @property
    def is_builtin(self) -> bool:
        return self.oid < FIRST_NORMAL_OID

    @property
    def qualified_name(self) -> str:
        """``typname`` for ``pg_catalog`` types, else ``schema.typname``."""
        if self.schema in ("pg_catalog", ""):
            return self.name
        return f"{_ident(self.schema)}.{_ident(self.name)}"

    def resolved(self, typmod: int = -1) -> tuple[PgTypeInfo, int]:
        """The type and typmod values actually have: a domain's base type and typmod
        (the column's own typmod applies to non-domains)."""
        if self.kind == "d" and self.base is not None:
            return self.base, self.base_typmod
        return self, typmod

    @classmethod
    def unknown(cls, oid: int, name: str = "unknown", schema: str = "") -> PgTypeInfo:
        """A type known only by OID and name (e.g. from a pgoutput Type message): it
        maps to its exact PostgreSQL text."""
        return cls(oid=oid, name=name, schema=schema, kind="b", category="U")


@dataclass(frozen=True, slots=True)
class PgColumn:
    """A column as the type map sees it.

    ``typmod`` is ``atttypmod`` (for arrays: the element's typmod). ``ndims`` is the
    number of array dimensions the values have (``pg_attribute.attndims`` when
    declared, e.g. ``int[][]``); 0 or 1 means one. ``as_text`` keeps the column as its
    exact PostgreSQL text whatever its type (the escape hatch for values that a typed
    mapping cannot represent, such as arrays with non-default lower bounds).
    """

    name: str
    type: PgTypeInfo
    typmod: int = -1
    ndims: int = 0
    as_text: bool = False


def _ident(name: str) -> str:
    if name and (name[0].isalpha() or name[0] == "_") and all(
        c.isalnum() or c == "_" for c in name
    ) and name == name.lower():
        return name
    return '"' + name.replace('"', '""') + '"'


# --------------------------------------------------------------------------- typmods


def numeric_precision_scale(typmod: int) -> tuple[int, int] | None:
    """``(precision, scale)`` of a ``numeric`` typmod, or None when unconstrained.

    PostgreSQL 15+ allows a negative scale and a scale above the precision; the scale
    is stored as an 11-bit two's complement number.
    """
    if typmod < VARHDRSZ:
        return None
    tm = typmod - VARHDRSZ
    precision = (tm >> 16) & 0xFFFF
    scale = ((tm & 0x7FF) ^ 1024) - 1024
    return precision, scale


_INTERVAL_FIELDS = {
    1 << 2: " year",
    1 << 1: " month",
    1 << 3: " day",
    1 << 10: " hour",
    1 << 11: " minute",
    1 << 12: " second",
    (1 << 2) | (1 << 1): " year to month",
    (1 << 3) | (1 << 10): " day to hour",
    (1 << 3) | (1 << 10) | (1 << 11): " day to minute",
    (1 << 3) | (1 << 10) | (1 << 11) | (1 << 12): " day to second",
    (1 << 10) | (1 << 11): " hour to minute",
    (1 << 10) | (1 << 11) | (1 << 12): " hour to second",
    (1 << 11) | (1 << 12): " minute to second",
    0x7FFF: "",
}


def typmod_suffix(type_: PgTypeInfo, typmod: int) -> str:
    """The ``(…)`` part of a type name for ``typmod`` (``""`` when there is none)."""
    if typmod < 0:
        return ""
    name = type_.name if type_.is_builtin else ""
    if name == "numeric":
        ps = numeric_precision_scale(typmod)
        return f"({ps[0]},{ps[1]})" if ps else ""
    if name in ("varchar", "bpchar"):
        return f"({typmod - VARHDRSZ})" if typmod >= VARHDRSZ else ""
    if name in ("bit", "varbit", "time", "timetz", "timestamp", "timestamptz"):
        return f"({typmod})"
    if name == "interval":
        fields = _INTERVAL_FIELDS.get((typmod >> 16) & 0x7FFF, "")
        precision = typmod & 0xFFFF
        return fields + (f"({precision})" if precision != 0xFFFF else "")
    return f"(typmod {typmod})"


def format_type(type_: PgTypeInfo, typmod: int = -1, ndims: int = 0) -> str:
    """``int4``, ``numeric(12,2)``, ``varchar(20)[]``, ``int4[][]``, ``public.mood``.

    Built-in types use their ``typname`` (``int4``, ``timestamptz``), as in the
    catalogs and pgoutput Type messages; arrays print as ``element[]`` (one ``[]`` per
    declared dimension).
    """
    if type_.element is not None:
        return format_type(type_.element, typmod) + "[]" * max(ndims, 1)
    return type_.qualified_name + typmod_suffix(type_, typmod)


# --------------------------------------------------------------------------- builtins

# oid, typname, typtype, typcategory, typdelim, array oid, range subtype oid (0 = none)
_BUILTINS: tuple[tuple[int, str, str, str, str, int, int], ...] = (
    (16, "bool", "b", "B", ",", 1000, 0),
    (17, "bytea", "b", "U", ",", 1001, 0),
    (18, "char", "b", "Z", ",", 1002, 0),
    (19, "name", "b", "S", ",", 1003, 0),
    (20, "int8", "b", "N", ",", 1016, 0),
    (21, "int2", "b", "N", ",", 1005, 0),
    (22, "int2vector", "b", "A", ",", 1006, 0),
    (23, "int4", "b", "N", ",", 1007, 0),
    (24, "regproc", "b", "N", ",", 1008, 0),
    (25, "text", "b", "S", ",", 1009, 0),
    (26, "oid", "b", "N", ",", 1028, 0),
    (27, "tid", "b", "U", ",", 1010, 0),
    (28, "xid", "b", "U", ",", 1011, 0),
    (29, "cid", "b", "U", ",", 1012, 0),
    (30, "oidvector", "b", "A", ",", 1013, 0),
    (114, "json", "b", "U", ",", 199, 0),
    (142, "xml", "b", "U", ",", 143, 0),
    (194, "pg_node_tree", "b", "Z", ",", 0, 0),
    (600, "point", "b", "G", ",", 1017, 0),
    (601, "lseg", "b", "G", ",", 1018, 0),
    (602, "path", "b", "G", ",", 1019, 0),
    (603, "box", "b", "G", ";", 1020, 0),
    (604, "polygon", "b", "G", ",", 1027, 0),
    (628, "line", "b", "G", ",", 629, 0),
    (650, "cidr", "b", "I", ",", 651, 0),
    (700, "float4", "b", "N", ",", 1021, 0),
    (701, "float8", "b", "N", ",", 1022, 0),
    (705, "unknown", "p", "X", ",", 0, 0),
    (718, "circle", "b", "G", ",", 719, 0),
    (774, "macaddr8", "b", "U", ",", 775, 0),
    (790, "money", "b", "N", ",", 791, 0),
    (829, "macaddr", "b", "U", ",", 1040, 0),
    (869, "inet", "b", "I", ",", 1041, 0),
    (1033, "aclitem", "b", "U", ",", 1034, 0),
    (1042, "bpchar", "b", "S", ",", 1014, 0),
    (1043, "varchar", "b", "S", ",", 1015, 0),
    (1082, "date", "b", "D", ",", 1182, 0),
    (1083, "time", "b", "D", ",", 1183, 0),
    (1114, "timestamp", "b", "D", ",", 1115, 0),
    (1184, "timestamptz", "b", "D", ",", 1185, 0),
    (1186, "interval", "b", "T", ",", 1187, 0),
    (1266, "timetz", "b", "D", ",", 1270, 0),
    (1560, "bit", "b", "V", ",", 1561, 0),
    (1562, "varbit", "b", "V", ",", 1563, 0),
    (1700, "numeric", "b", "N", ",", 1231, 0),
    (1790, "refcursor", "b", "U", ",", 2201, 0),
    (2202, "regprocedure", "b", "N", ",", 2207, 0),
    (2203, "regoper", "b", "N", ",", 2208, 0),
    (2204, "regoperator", "b", "N", ",", 2209, 0),
    (2205, "regclass", "b", "N", ",", 2210, 0),
    (2206, "regtype", "b", "N", ",", 2211, 0),
    (2950, "uuid", "b", "U", ",", 2951, 0),
    (2970, "txid_snapshot", "b", "U", ",", 2949, 0),
    (3220, "pg_lsn", "b", "U", ",", 3221, 0),
    (3614, "tsvector", "b", "U", ",", 3643, 0),
    (3615, "tsquery", "b", "U", ",", 3645, 0),
    (3734, "regconfig", "b", "N", ",", 3735, 0),
    (3769, "regdictionary", "b", "N", ",", 3770, 0),
    (3802, "jsonb", "b", "U", ",", 3807, 0),
    (4072, "jsonpath", "b", "U", ",", 4073, 0),
    (4089, "regnamespace", "b", "N", ",", 4090, 0),
    (4096, "regrole", "b", "N", ",", 4097, 0),
    (4191, "regcollation", "b", "N", ",", 4192, 0),
    (5038, "pg_snapshot", "b", "U", ",", 5039, 0),
    (5069, "xid8", "b", "U", ",", 271, 0),
    (3904, "int4range", "r", "R", ",", 3905, 23),
    (3906, "numrange", "r", "R", ",", 3907, 1700),
    (3908, "tsrange", "r", "R", ",", 3909, 1114),
    (3910, "tstzrange", "r", "R", ",", 3911, 1184),
    (3912, "daterange", "r", "R", ",", 3913, 1082),
    (3926, "int8range", "r", "R", ",", 3927, 20),
    # multiranges: the last field is the range type
    (4451, "int4multirange", "m", "R", ",", 6150, 3904),
    (4532, "nummultirange", "m", "R", ",", 6151, 3906),
    (4533, "tsmultirange", "m", "R", ",", 6152, 3908),
    (4534, "tstzmultirange", "m", "R", ",", 6153, 3910),
    (4535, "datemultirange", "m", "R", ",", 6155, 3912),
    (4536, "int8multirange", "m", "R", ",", 6157, 3926),
)


def _build_builtins() -> dict[int, PgTypeInfo]:
    out: dict[int, PgTypeInfo] = {}
    for oid, name, kind, category, delim, _array, _sub in _BUILTINS:
        if kind in ("b", "p"):
            out[oid] = PgTypeInfo(oid, name, "pg_catalog", kind, category, delim)
    for oid, name, kind, category, delim, _array, sub in _BUILTINS:
        if kind == "r":
            out[oid] = PgTypeInfo(oid, name, "pg_catalog", kind, category, delim, subtype=out[sub])
    for oid, name, kind, category, delim, _array, sub in _BUILTINS:
        if kind == "m":
            rng = out[sub]
            out[oid] = PgTypeInfo(
                oid, name, "pg_catalog", kind, category, delim, subtype=rng.subtype, range=rng
            )
    for oid, name, _kind, _category, _delim, array, _sub in _BUILTINS:
        if array:
            # an array type's typdelim is its element's
            out[array] = PgTypeInfo(array, "_" + name, "pg_catalog", "b", "A", _delim, element=out[oid])
    return out


BUILTIN_TYPES: dict[int, PgTypeInfo] = _build_builtins()
"""Built-in types by OID: base types, ranges, multiranges and the arrays of each."""

BUILTIN_BY_NAME: dict[str, PgTypeInfo] = {t.name: t for t in BUILTIN_TYPES.values()}
"""The same, by ``typname`` (``int4``, ``_int4``, ``timestamptz``...)."""


def builtin_type(oid: int) -> PgTypeInfo | None:
    """The built-in type with this OID, or None."""
    return BUILTIN_TYPES.get(oid)
