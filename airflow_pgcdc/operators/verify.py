"""``PgcdcVerifyOperator``: ``pgcdc verify`` for a list of tables, as a task."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator

from airflow_pgcdc.hooks.compat import AirflowFailException
from airflow_pgcdc.hooks.pgcdc import PgcdcHook
from airflow_pgcdc.operators.values import number


class PgcdcTablesDiffer(AirflowFailException):
    """At least one Delta table differs from its PostgreSQL table (no retry helps)."""


class PgcdcVerifyOperator(BaseOperator):
    """Compare each PostgreSQL table with its Delta table (see :mod:`airflow_pgcdc.verify`):
    row counts, keys on one side only, rows that differ, exactly (types included).

    Meaningful when the source is quiet (or has not changed since the last merged
    window): a busy source differs by the changes not merged yet. Fails (no retry) when a
    table differs and ``fail_on_difference`` is set.

    Returns ``{"equal": bool, "tables": {"schema.table": <VerifyResult.to_dict()>}}``.

    :param delta: Delta root ``s3://bucket/lake`` (templated)
    :param tables: ``schema.table`` names (templated)
    :param keys: key columns per table without primary key / replica identity index
    :param max_diffs: differing keys listed per table
    :param store: the pipeline's store, with ``slot``: its column rules (excluded, hashed,
        masked columns) are applied to PostgreSQL's rows before they are compared (templated)
    :param slot: the pipeline's slot (templated)
    :param pii_key_conn_id: Airflow connection whose password is the hash key of the slot's
        column rules (any connection type; default: the worker's ``PGCDC_PII_KEY``) (templated)
    :param postgres_conn_id: Airflow ``postgres`` connection
    :param aws_conn_id: Airflow ``aws`` connection; ``None``: boto3's environment
    """

    template_fields: Sequence[str] = ("delta", "tables", "max_diffs", "store", "slot", "pii_key_conn_id",
                                      "postgres_conn_id", "aws_conn_id")
    ui_color = "#e8daef"

    def __init__(
        self,
        *,
        delta: str,
        tables: Sequence[str] | str,
        keys: Mapping[str, Sequence[str]] | None = None,
        max_diffs: int = 10,
        fail_on_difference: bool = True,
        store: str | None = None,
        slot: str | None = None,
        pii_key_conn_id: str | None = None,
        postgres_conn_id: str = PgcdcHook.default_conn_name,
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.delta = delta
        self.tables = tables
        self.keys = dict(keys or {})
        self.max_diffs = max_diffs
        self.fail_on_difference = fail_on_difference
        self.store = store
        self.slot = slot
        self.pii_key_conn_id = pii_key_conn_id
        self.postgres_conn_id = postgres_conn_id
        self.aws_conn_id = aws_conn_id

    def _table_list(self) -> list[str]:
        value = self.tables
        if isinstance(value, str):
            return [t for t in value.replace(",", " ").split() if t]
        return [str(t) for t in value or ()]

    def execute(self, context) -> dict[str, Any]:
        from airflow_pgcdc.pg.tables import parse_table_names
        from airflow_pgcdc.verify import verify_table

        hook = PgcdcHook(self.postgres_conn_id, self.aws_conn_id)
        settings = hook.s3_settings()
        privacy = None
        if self.store and self.slot:
            from airflow_pgcdc.store.layout import Layout
            from airflow_pgcdc.store.privacy import resolve_privacy

            with hook.pii_key(self.pii_key_conn_id):
                privacy = resolve_privacy(hook.s3_client(), Layout.parse(self.store), self.slot, write=False)
        out: dict[str, Any] = {}
        different = []
        for name in self._table_list():
            [(schema, table)] = parse_table_names([name])
            result = verify_table(
                hook.get_dsn(), self.delta, schema, table, key=self.keys.get(name),
                max_diffs=number(self.max_diffs, int, "max_diffs", minimum=0), s3=settings,
                progress=lambda m: self.log.info("%s", m), privacy=privacy,
            )
            report = result.to_dict()
            out[name] = report
            c = report["counts"]
            self.log.info(
                "%s: %s (PostgreSQL %s rows, Delta %s rows; only in PostgreSQL %s, only in Delta %s, changed %s)",
                name, report["result"], report["postgres"]["rows"], report["delta"]["rows"],
                c["only_in_postgres"], c["only_in_delta"], c["changed"],
            )
            if not result.equal:
                different.append(name)
        if different and self.fail_on_difference:
            raise PgcdcTablesDiffer(
                f"Delta differs from PostgreSQL for {', '.join(different)}: run `pgcdc verify` "
                "for the differing keys"
            )
        return {"equal": not different, "tables": out}
