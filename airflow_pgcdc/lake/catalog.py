"""A Hive Metastore kept in step with the Delta tables (``pgcdc merge --catalog
thrift://host:port``): each pipeline table is registered by name, as Spark registers a Delta
table (``CREATE TABLE db.t USING DELTA LOCATION …``), so Spark SQL, and engines that read a
metastore, find it as ``db.t``; AWS Glue speaks the same model. No Spark, no JVM: a Thrift
client (thriftpy2, the ``catalog`` extra) on the part of the metastore's interface in
``hive_metastore.thrift``.

Names (:func:`hive_name`, :func:`catalog_names`): a PostgreSQL table ``schema.table`` is
``{prefix}{schema}.{table}`` in the metastore, each name mapped so that two source names never
meet: a name of lower-case letters, digits and single ``_`` is itself; any other name is
spelled with every character outside ``[a-z0-9]`` as ``__{hex code}_`` (``Orders`` →
``__4f_rders``, ``my table`` → ``my__20_table``, ``a_B`` → ``a__5f___42_``); such a spelling
always holds ``__``, which a name left as itself never does. A table's own name can be given
(``--table-option schema.table:catalog_name=db.name``).

What a registered table holds (:func:`table_entry`): type ``EXTERNAL_TABLE`` and
``EXTERNAL=TRUE`` (the metastore never deletes its files), ``spark.sql.sources.provider=delta``
and the Delta table's URL in the serde parameter ``path`` (``s3a://``: what Spark reads), its
columns as Hive types, and ``pgcdc.*`` parameters: the slot, the source table, and
``pgcdc.left_pipeline`` when the table left the pipeline (dropped, or out of the publication:
the entry stays, marked, as the Delta table stays). The storage descriptor's own location is
left to the metastore's default (a folder under its warehouse), as Spark leaves it: a real
``s3a://`` location there would have the metastore itself reach S3."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa

from airflow_pgcdc.errors import HintedError

__all__ = ["CatalogEntry", "CatalogError", "Metastore", "catalog_names", "hive_name", "hive_type", "table_entry"]

_PLAIN = re.compile(r"[a-z0-9_]+")
MAX_NAME = 128
"""The longest database or table name the metastore keeps."""


class CatalogError(HintedError):
    """The metastore could not be reached, or refused a name or an entry."""


def hive_name(name: str) -> str:
    """``name`` (a PostgreSQL identifier, any case and character) as a metastore name that no
    other identifier maps to (see the module's docstring)."""
    if name and _PLAIN.fullmatch(name) and "__" not in name:
        return name
    return "".join(c if ("a" <= c <= "z" or "0" <= c <= "9") else f"__{ord(c):x}_" for c in name)


def catalog_names(schema: str, table: str, *, prefix: str = "", given: str | None = None) -> tuple[str, str]:
    """``(database, table)`` of ``schema.table`` in the metastore: ``given`` (``db.name``, a
    table's own ``catalog_name``) as it is, else ``prefix`` + :func:`hive_name` of the schema
    and :func:`hive_name` of the table. :class:`CatalogError` for a name the metastore cannot
    hold (too long, or a ``given`` one that is not ``db.name`` of plain names)."""
    if given is not None:
        db, dot, name = given.partition(".")
        if not dot or not _PLAIN.fullmatch(db) or not _PLAIN.fullmatch(name):
            raise CatalogError(f"catalog_name {given!r} of {schema}.{table} must be database.table, each of "
                               "lower-case letters, digits and '_'")
        out = (db, name)
    else:
        out = (prefix + hive_name(schema), hive_name(table))
    for part in out:
        if len(part) > MAX_NAME:
            raise CatalogError(f"{schema}.{table}: the metastore name {part!r} is longer than {MAX_NAME} characters",
                               hint=f"give it a name: --table-option {schema}.{table}:catalog_name=db.name")
    return out


_HIVE_NAMES = (
    (pa.types.is_boolean, "boolean"), (pa.types.is_int8, "tinyint"), (pa.types.is_int16, "smallint"),
    (pa.types.is_int32, "int"), (pa.types.is_int64, "bigint"), (pa.types.is_float32, "float"),
    (pa.types.is_float64, "double"), (pa.types.is_string, "string"), (pa.types.is_large_string, "string"),
    (pa.types.is_string_view, "string"), (pa.types.is_binary, "binary"), (pa.types.is_large_binary, "binary"),
    (pa.types.is_binary_view, "binary"), (pa.types.is_date, "date"), (pa.types.is_timestamp, "timestamp"),
)
"""The Arrow types whose Hive type is one name."""


def hive_type(t: pa.DataType) -> str:
    """The Hive type of an Arrow (Delta) type: what other engines show; Spark reads a Delta
    table's schema from its log, not from here."""
    for is_it, name in _HIVE_NAMES:
        if is_it(t):
            return name
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"array<{hive_type(t.value_type)}>"
    if pa.types.is_map(t):
        return f"map<{hive_type(t.key_type)},{hive_type(t.item_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"{f.name}:{hive_type(f.type)}" for f in t) + ">"
    return "string"


@dataclass(frozen=True)
class CatalogEntry:
    """One table's entry: where (``database``, ``name``), the Delta table (``path``, as Spark
    reads it), its ``columns`` (name, Hive type) and ``parameters`` (``pgcdc.*``)."""

    database: str
    name: str
    path: str
    columns: tuple[tuple[str, str], ...]
    parameters: Mapping[str, str] = field(default_factory=dict)


def table_entry(database: str, name: str, delta_url: str, schema: pa.Schema,
                parameters: Mapping[str, str]) -> CatalogEntry:
    """The entry of the Delta table at ``delta_url`` (``s3://``: given as ``s3a://``) of
    ``schema`` (its Arrow schema)."""
    path = "s3a://" + delta_url[len("s3://"):] if delta_url.startswith("s3://") else delta_url
    return CatalogEntry(database, name, path, tuple((f.name, hive_type(f.type)) for f in schema),
                        dict(parameters))


_MODULE: Any = None


def _idl():
    global _MODULE
    if _MODULE is None:
        try:
            import thriftpy2
        except ImportError:
            raise CatalogError("the catalog needs thriftpy2", hint="pip install 'airflow-pgcdc[catalog]'") from None
        import io
        import pkgutil

        # read as package data: under spark-submit --py-files the package is a zip
        text = pkgutil.get_data(__package__, "hive_metastore.thrift")
        if text is None:
            raise CatalogError("the package lacks airflow_pgcdc/lake/hive_metastore.thrift (a broken install)")
        _MODULE = thriftpy2.load_fp(io.StringIO(text.decode()), module_name="pgcdc_hive_metastore_thrift")
    return _MODULE


def _address(uri: str) -> tuple[str, int]:
    parsed = urlparse(uri)
    if parsed.scheme != "thrift" or not parsed.hostname:
        raise CatalogError(f"the catalog must be thrift://host:port (a Hive Metastore), got {uri!r}")
    return parsed.hostname, parsed.port or 9083


class Metastore:
    """A connection to the Hive Metastore at ``uri`` (``thrift://host:port``; plain binary
    protocol, buffered transport: the metastore's default, no SASL)."""

    def __init__(self, uri: str, *, timeout: float = 60.0, catalog: str = "hive") -> None:
        self.uri, self.catalog = uri, catalog
        self.host, self.port = _address(uri)
        self.timeout = timeout
        self.t = _idl()
        self._client: Any = None

    def __enter__(self) -> Metastore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None

    @property
    def client(self):
        if self._client is None:
            from thriftpy2.protocol import TBinaryProtocolFactory
            from thriftpy2.rpc import make_client
            from thriftpy2.transport import TBufferedTransportFactory

            try:
                self._client = make_client(self.t.ThriftHiveMetastore, self.host, self.port,
                                           timeout=int(self.timeout * 1000), proto_factory=TBinaryProtocolFactory(),
                                           trans_factory=TBufferedTransportFactory())
            except Exception as exc:  # noqa: BLE001 - the socket's own error, named
                raise CatalogError(f"cannot reach the Hive Metastore at {self.uri}: {type(exc).__name__}: {exc}",
                                   hint="is it running, and is --catalog its thrift://host:port?") from None
        return self._client

    def _call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except self.t.NoSuchObjectException:
            raise
        except Exception as exc:  # noqa: BLE001 - reconnect next time: the metastore closes the socket
            self.close()
            message = getattr(exc, "message", None) or str(exc)
            raise CatalogError(f"Hive Metastore {self.uri}: {what}: {type(exc).__name__}: {message}") from None

    def ensure_database(self, name: str) -> bool:
        """Create the database ``name`` unless it exists; True when it was created."""
        try:
            self._call(f"get_database {name}", self.client.get_database, name)
            return False
        except self.t.NoSuchObjectException:
            pass
        db = self.t.Database(name=name, description="pgcdc: Delta tables of a PostgreSQL pipeline", parameters={},
                             ownerName="pgcdc", ownerType=self.t.PrincipalType.USER, catalogName=self.catalog)
        try:
            self._call(f"create_database {name}", self.client.create_database, db)
        except CatalogError as exc:
            if "AlreadyExists" not in str(exc):  # another job made it meanwhile
                raise
        return True

    def tables(self, database: str, names: Sequence[str]) -> dict[str, Any]:
        """The entries of ``names`` in ``database`` that exist, by name (one request)."""
        if not names:
            return {}
        req = self.t.GetTablesRequest(dbName=database, tblNames=list(names), catName=self.catalog)
        found = self._call(f"get_table_objects_by_name_req {database}", self.client.get_table_objects_by_name_req, req)
        return {t.tableName: t for t in found.tables}

    def table(self, database: str, name: str):
        """The metastore's entry of ``database.name``, or None."""
        return self.tables(database, [name]).get(name)

    def _table(self, entry: CatalogEntry, existing=None):
        t = self.t
        serde = t.SerDeInfo(serializationLib="org.apache.hadoop.hive.serde2.lazy.LazySimpleSerDe",
                            parameters={"serialization.format": "1", "path": entry.path})
        sd = t.StorageDescriptor(
            cols=[t.FieldSchema(name=n, type=ty, comment="") for n, ty in entry.columns],
            location=existing.sd.location if existing is not None and existing.sd is not None else None,
            inputFormat="org.apache.hadoop.mapred.SequenceFileInputFormat",
            outputFormat="org.apache.hadoop.hive.ql.io.HiveSequenceFileOutputFormat",
            compressed=False, numBuckets=-1, serdeInfo=serde, bucketCols=[], sortCols=[], parameters={})
        params = dict(existing.parameters or {}) if existing is not None else {}
        params.update({"EXTERNAL": "TRUE", "spark.sql.sources.provider": "delta", **entry.parameters})
        for gone in [k for k in params if k.startswith("pgcdc.") and k not in entry.parameters]:
            del params[gone]
        return t.Table(tableName=entry.name, dbName=entry.database, owner="pgcdc", tableType="EXTERNAL_TABLE",
                       sd=sd, partitionKeys=[], parameters=params, catName=self.catalog)

    @staticmethod
    def _same(existing, entry: CatalogEntry) -> bool:
        if existing.sd is None or existing.tableType != "EXTERNAL_TABLE":
            return False
        params = existing.parameters or {}
        mine = {k: v for k, v in params.items() if k.startswith("pgcdc.")}
        return (params.get("spark.sql.sources.provider") == "delta" and params.get("EXTERNAL") == "TRUE"
                and (existing.sd.serdeInfo.parameters or {}).get("path") == entry.path
                and [(c.name, c.type) for c in existing.sd.cols or ()] == list(entry.columns)
                and mine == dict(entry.parameters))

    def register(self, entries: Sequence[CatalogEntry]) -> dict[str, str]:
        """Create or bring up to date each entry (its database made when missing); returns
        ``{"db.name": "created" | "updated" | "unchanged"}``. One request per database to read
        what is there; an entry is written only when it differs."""
        out: dict[str, str] = {}
        by_db: dict[str, list[CatalogEntry]] = {}
        for e in entries:
            by_db.setdefault(e.database, []).append(e)
        no_stats = self.t.EnvironmentContext(properties={"DO_NOT_UPDATE_STATS": "true"})
        for db, group in by_db.items():
            existing = {} if self.ensure_database(db) else self.tables(db, [e.name for e in group])
            for e in group:
                old = existing.get(e.name)
                if old is None:
                    self._call(f"create_table {db}.{e.name}", self.client.create_table_with_environment_context,
                               self._table(e), no_stats)
                    out[f"{db}.{e.name}"] = "created"
                elif self._same(old, e):
                    out[f"{db}.{e.name}"] = "unchanged"
                else:
                    self._call(f"alter_table {db}.{e.name}", self.client.alter_table_with_environment_context,
                               db, e.name, self._table(e, old), no_stats)
                    out[f"{db}.{e.name}"] = "updated"
        return out

    def databases(self) -> Iterator[str]:
        yield from self._call("get_all_databases", self.client.get_all_databases)
