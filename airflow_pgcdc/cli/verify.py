"""``pgcdc verify``: check that a Delta table equals its PostgreSQL source.

Exit code 0 when the tables are equal, 1 when they differ (the report says how) or when
they cannot be compared (one ``pgcdc: error:`` line with a hint). The library call is
:func:`airflow_pgcdc.verify.verify_table`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

MAX_SHOWN_CHARS = 120


def register(subparsers) -> None:
    from airflow_pgcdc.cli import add_dsn_argument

    p = subparsers.add_parser(
        "verify",
        help="check that a Delta table equals its PostgreSQL table",
        description=(
            "Read a PostgreSQL table (one REPEATABLE READ transaction, through the snapshot's "
            "type map) and its Delta table (<delta>/<schema>.<table>), match rows on the key and "
            "compare every value exactly. Prints EQUAL or DIFFERENT with the row counts, the keys "
            "only on one side and the keys whose rows differ (with the columns and both values). "
            "Exit code 0: equal; 1: different, or an error. S3 endpoint and keys come from "
            "AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (boto3's conventions)."
        ),
    )
    add_dsn_argument(p, 'of the source database')
    p.add_argument("--delta", required=True, metavar="URL",
                   help="the Delta root, e.g. s3://bucket/lake (tables are at URL/<schema>.<table>)")
    p.add_argument("--table", required=True, metavar="SCHEMA.TABLE",
                   help='the source table (no schema: public; quote odd names: \'s."Odd.Name"\')')
    p.add_argument("--key", metavar="COL,...",
                   help="columns that identify a row (default: replica identity index or primary key)")
    p.add_argument("--max-diffs", type=int, default=10, metavar="N",
                   help="show at most N keys of each kind of difference (default 10)")
    p.add_argument("--check-metadata", action="store_true",
                   help="also check the Delta table's CDC metadata columns (pgcdc merge --metadata-columns): "
                   "exit 1 when a row's are invalid")
    p.add_argument("--store", metavar="URL",
                   help="the pipeline's store (with --slot): its column rules (excluded, hashed, masked columns) "
                   "are applied to PostgreSQL's rows before they are compared; the hash key from $PGCDC_PII_KEY")
    p.add_argument("--slot", help="the pipeline's slot (with --store)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=run_verify)


def split_key(text: str) -> list[str]:
    """``a,b`` → ``["a", "b"]``; double quotes protect commas (``"a,b",c``), ``""`` is a quote.
    Names are taken as written (PostgreSQL's spelling: usually lowercase)."""
    out, cur, quoted, i = [], [], False, 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            if quoted and i + 1 < len(text) and text[i + 1] == '"':
                cur.append('"')
                i += 2
                continue
            quoted = not quoted
        elif ch == "," and not quoted:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
        i += 1
    out.append("".join(cur).strip())
    return out


def run_verify(args: argparse.Namespace) -> int:
    from airflow_pgcdc.pg.tables import parse_table_names
    from airflow_pgcdc.verify import VerifyError, verify_table

    if args.max_diffs < 0:
        raise VerifyError("--max-diffs must be 0 or more", hint="e.g. --max-diffs 10")
    [(schema, table)] = parse_table_names([args.table])
    key = None
    if args.key is not None:
        key = split_key(args.key)
        if not all(key):
            raise VerifyError(f"empty column name in --key {args.key!r}", hint="--key a,b")

    def progress(message: str) -> None:
        print(f"pgcdc verify: {message}", file=sys.stderr, flush=True)

    privacy = None
    if bool(args.store) != bool(args.slot):
        raise VerifyError("--store and --slot go together", hint="give both (the pipeline's), or neither")
    if args.store:
        from airflow_pgcdc.store import s3 as s3store
        from airflow_pgcdc.store.layout import Layout
        from airflow_pgcdc.store.privacy import resolve_privacy

        privacy = resolve_privacy(s3store.make_s3_client(), Layout.parse(args.store), args.slot, write=False)
    result = verify_table(
        args.dsn, args.delta, schema, table, key=key, max_diffs=args.max_diffs, progress=progress,
        check_metadata=args.check_metadata, privacy=privacy,
    )
    if args.json:
        json.dump(result.to_dict(), sys.stdout, indent=2, ensure_ascii=False, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_report(result))
        if result.metadata is not None:
            m = result.metadata
            sys.stdout.write(f"metadata columns: {m['rows']} rows, {m['invalid']} invalid, {m['without']} without "
                             f"(merged before the columns were added), newest commit LSN {m['newest_commit_lsn']}\n")
    return 0 if result.equal and result.metadata_ok else 1


# --------------------------------------------------------------------------- human output

_PLAIN = re.compile(rf"[^\s'\",=]{{1,{MAX_SHOWN_CHARS}}}")


def _value(text: str | None, chars: int | None = None) -> str:
    """A value for the report: NULL, plain text, or a JSON string (cut, with its length)."""
    if text is None:
        return "NULL"
    chars = len(text) if chars is None else chars
    if _PLAIN.fullmatch(text) and text != "NULL" and chars == len(text):
        return text
    out = json.dumps(text[:MAX_SHOWN_CHARS], ensure_ascii=False)
    if chars > MAX_SHOWN_CHARS:
        out += f"… ({chars} characters)"
    return out


def _key(key: dict) -> str:
    return ", ".join(f"{k}={_value(v)}" for k, v in key.items())


def _count_line(n: int, shown: int) -> str:
    return f"{n}" if shown >= n else f"{n}, first {shown}"


def render_report(result) -> str:
    """The human report of a :class:`~airflow_pgcdc.verify.VerifyResult`."""
    c = result.comparison
    lines = [f"{'EQUAL' if result.equal else 'DIFFERENT'}  {result.table}"]
    lsn = f", LSN {result.postgres_lsn}" if result.postgres_lsn else ""
    lines.append(f"  postgres  {c.postgres_rows} rows  ({result.postgres}{lsn})")
    commit = result.delta_last_commit
    last = ""
    if commit:
        last = f", last commit {commit.get('timestamp', '?')} {commit.get('operation', '')}".rstrip()
        pgcdc = [f"{k}={v}" for k, v in sorted(commit.items()) if k.startswith("pgcdc")]
        if pgcdc:  # what the merge recorded: windows, LSN range
            last += " " + " ".join(pgcdc)
    lines.append(f"  delta     {c.delta_rows} rows  ({result.delta_url}, version {result.delta_version}{last})")
    lines.append(
        f"  key       {', '.join(c.key_columns)} ({result.key_source}); "
        f"{len(c.compared_columns)} columns compared"
    )
    lines.append(f"  only in PostgreSQL  {c.only_in_postgres}")
    lines.append(f"  only in Delta       {c.only_in_delta}")
    lines.append(f"  changed             {c.changed}")
    if c.duplicate_keys_postgres or c.duplicate_keys_delta:
        lines.append(
            f"  duplicate keys      {c.duplicate_keys_postgres} in PostgreSQL, {c.duplicate_keys_delta} in Delta"
        )
    for name in c.missing_in_delta:
        lines.append(f"schema: column {name} is missing from the Delta table (not compared)")
    for m in c.type_mismatches:
        lines.append(
            f"schema: column {m.column} ({m.pg_type}) is {m.found} in Delta, expected {m.expected} (not compared)"
        )
    if c.delta_only_columns:
        lines.append(
            "note: columns only in Delta (not compared; dropped in PostgreSQL?): "
            + ", ".join(c.delta_only_columns)
        )
    if c.sample_only_in_postgres:
        lines.append("")
        lines.append(f"only in PostgreSQL ({_count_line(c.only_in_postgres, len(c.sample_only_in_postgres))}):")
        lines.extend(f"  {_key(k)}" for k in c.sample_only_in_postgres)
    if c.sample_only_in_delta:
        lines.append("")
        lines.append(f"only in Delta ({_count_line(c.only_in_delta, len(c.sample_only_in_delta))}):")
        lines.extend(f"  {_key(k)}" for k in c.sample_only_in_delta)
    if c.sample_changed:
        lines.append("")
        lines.append(f"changed ({_count_line(c.changed, len(c.sample_changed))}):")
        for row in c.sample_changed:
            lines.append(f"  {_key(row.key)}")
            for d in row.columns:
                lines.append(
                    f"    {d.column}: postgres {_value(d.postgres, d.postgres_chars)}"
                    f" | delta {_value(d.delta, d.delta_chars)}"
                )
    if c.sample_duplicates:
        lines.append("")
        lines.append("duplicate keys:")
        for d in c.sample_duplicates:
            side = "PostgreSQL" if d.side == "postgres" else "Delta"
            lines.append(f"  {_key(d.key)}: {d.count} rows in {side}")
    return "\n".join(lines) + "\n"
