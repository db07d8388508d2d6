"""The ``pgcdc`` command.

Subcommands live in their own modules of this package (``cli/<command>.py``), listed in
:data:`COMMANDS`. To add one, write a
module with a function ``register(subparsers)`` that adds its parser(s) and sets a
handler with ``parser.set_defaults(handler=fn)``; ``fn(args)`` returns an exit code
(``None`` means 0). Then append the module's name to :data:`COMMANDS`.

Conventions for command modules:

- import nothing heavy (Airflow, pyarrow, Spark) at module level: import inside the
  handler, so ``pgcdc --help`` and every other command stay fast and independent;
- raise :class:`~airflow_pgcdc.errors.PgcdcError` (optionally with a ``hint``
  attribute) for failures the user can fix: ``main`` prints one line
  ``pgcdc: error: <message>`` (plus ``hint: <hint>``) and exits 1; the traceback only
  with ``--verbose`` (or ``PGCDC_VERBOSE=1``);
- write results to stdout, progress and notes to stderr; never print a password or a
  secret key (``pgcdc sandbox env`` is the one deliberate exception).

Exit codes: 0 success, 1 failure, 2 usage error (argparse), 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from airflow_pgcdc.errors import PgcdcError

COMMANDS: list[str] = [
    "airflow_pgcdc.cli.sandbox",
    "airflow_pgcdc.cli.peek",
    "airflow_pgcdc.cli.basebackup",
    "airflow_pgcdc.cli.snapshot",
    "airflow_pgcdc.cli.resync",
    "airflow_pgcdc.cli.recover",
    "airflow_pgcdc.cli.drain",
    "airflow_pgcdc.cli.slots",
    "airflow_pgcdc.cli.verify",
    "airflow_pgcdc.cli.merge",
    "airflow_pgcdc.cli.rebuild",
    "airflow_pgcdc.cli.maintain",
]

PROG = "pgcdc"
DSN_ENV = "PGCDC_DSN"
_DSN_HELP = (
    "libpq connection string {what} (default: ${env}). Keep the password off the command "
    "line, where every user of the host sees it (ps): put the whole string in ${env}, or the "
    "password in PGPASSWORD or a passfile (~/.pgpass, PGPASSFILE), which libpq reads"
)


def add_dsn_argument(parser: argparse.ArgumentParser, what: str = "of the source database") -> None:
    """``--dsn``, defaulting to ``$PGCDC_DSN`` (see :func:`resolve_dsn`)."""
    parser.add_argument("--dsn", default=None, help=_DSN_HELP.format(what=what, env=DSN_ENV))


def resolve_dsn(args: argparse.Namespace) -> None:
    """Fill ``args.dsn`` from ``$PGCDC_DSN`` when ``--dsn`` was not given; warn when the
    given one carries a password (it is on the command line)."""
    if not hasattr(args, "dsn"):
        return
    if args.dsn is None:
        args.dsn = os.environ.get(DSN_ENV)
        if not args.dsn:
            raise _Usage(f"give --dsn or set {DSN_ENV} (the libpq connection string)")
        return
    from airflow_pgcdc.pg.conninfo import has_password

    if has_password(args.dsn):
        print(
            f"{PROG}: warning: the password is on the command line, visible to every user of this "
            f"host (ps): pass the connection string in {DSN_ENV}, or the password in PGPASSWORD or "
            "a passfile",
            file=sys.stderr,
        )


class _Usage(Exception):
    """A usage error found after parsing (exit code 2)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="airflow-pgcdc: PostgreSQL snapshot + logical changes into Delta Lake on S3.",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true",
        help="show tracebacks on errors (also: PGCDC_VERBOSE=1; --verbose may follow the subcommand)",
    )
    from airflow_pgcdc import package_version

    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    subparsers.required = True
    for name in COMMANDS:
        importlib.import_module(name).register(subparsers)
    return parser


def _split_verbose(argv: list[str]) -> tuple[list[str], bool]:
    """``--verbose`` is accepted anywhere before ``--`` (e.g. ``pgcdc sandbox up --verbose``)."""
    out, verbose, passthrough = [], False, False
    for arg in argv:
        if arg == "--":
            passthrough = True
        if not passthrough and arg == "--verbose":
            verbose = True
            continue
        out.append(arg)
    return out, verbose


def error(message: str, hint: str | None = None) -> None:
    """Print the one-line error (and hint) the way every command does."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    if hint:
        print(f"hint: {hint}", file=sys.stderr)


CONNECT_TIMEOUT = 15
"""Seconds libpq may take to connect (``PGCONNECT_TIMEOUT``, unless set, or the DSN's
``connect_timeout``) in a ``pgcdc`` command."""


def describe_external(e: BaseException) -> tuple[str, str | None] | None:
    """``(message, hint)`` for a failure of something outside us that a command met (the
    database cannot be reached, an S3 call refused), instead of an "unexpected" error;
    None for anything else (a bug: reported as unexpected)."""
    import psycopg

    if isinstance(e, psycopg.OperationalError):
        return (f"PostgreSQL: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}",
                "check the DSN's host, port and dbname, that the server is PostgreSQL and accepts this "
                f"client (pg_hba.conf); connecting gives up after {os.environ.get('PGCONNECT_TIMEOUT')} s "
                "(PGCONNECT_TIMEOUT, or connect_timeout in the DSN)")
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # pragma: no cover - boto3 is a dependency
        return None
    if isinstance(e, ClientError):
        err = e.response.get("Error", {})
        op = getattr(e, "operation_name", "?")
        what = err.get("BucketName") or err.get("Key") or ""
        return (f"S3: {op} {what} failed: {err.get('Code', '?')}: {err.get('Message', '')}".replace("  ", " "),
                "check the store URL (bucket and prefix) and the S3 endpoint, region and credentials "
                "(AWS_* variables or the aws connection)")
    if isinstance(e, BotoCoreError):
        return (f"S3: {e}", "check the S3 endpoint (AWS_ENDPOINT_URL), region and credentials")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args_list, verbose = _split_verbose(list(sys.argv[1:] if argv is None else argv))
    verbose = verbose or os.environ.get("PGCDC_VERBOSE", "") not in ("", "0")
    parser = build_parser()
    args = parser.parse_args(args_list)  # exits 2 on usage errors
    verbose = verbose or args.verbose
    args.verbose = verbose
    try:
        resolve_dsn(args)
    except _Usage as e:
        parser.error(str(e))  # exits 2
    # libpq waits for a server that accepts the connection and never answers (a port that is
    # not PostgreSQL) until TCP gives up, minutes later: bound it unless the user chose
    os.environ.setdefault("PGCONNECT_TIMEOUT", str(CONNECT_TIMEOUT))
    try:
        code = args.handler(args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except PgcdcError as e:
        if verbose:
            traceback.print_exc()
        message = str(e).strip()
        first, _, rest = message.partition("\n")
        error(first, getattr(e, "hint", None))
        if rest and verbose:
            print(rest, file=sys.stderr)
        elif rest:
            print(f"({len(rest.splitlines())} more lines with --verbose)", file=sys.stderr)
        return 1
    except Exception as e:  # a bug, or a failure outside us: still one readable line
        if verbose:
            traceback.print_exc()
        known = describe_external(e)
        if known is not None:
            error(*known)
            return 1
        error(
            f"unexpected {type(e).__name__}: {e}",
            None if verbose else "run again with --verbose for the traceback",
        )
        return 1
    return 0 if code is None else int(code)

