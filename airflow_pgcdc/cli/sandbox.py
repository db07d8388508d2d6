"""``pgcdc sandbox up|env|status|down``: a local PostgreSQL + S3 to try the pipeline on.

``up`` starts both servers in the background (they outlive the command), state and logs
under ``.pgcdc/`` in the current directory; ``eval "$(pgcdc sandbox env)"`` then points
psql, boto3, the AWS CLI and pgcdc at them; ``down`` stops them (``--purge`` also deletes
the data). Only ``env`` prints credentials: the user asks for them.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Mapping


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "sandbox",
        help="run a local PostgreSQL + S3 sandbox in the background",
        description=(
            "up starts PostgreSQL and S3 in the background (they outlive the command), with "
            "state, data and logs under ./.pgcdc; eval \"$(pgcdc sandbox env)\" then points "
            "psql, boto3, the AWS CLI and pgcdc at them; down stops them (--purge also "
            "deletes the data). Only env prints credentials."
        ),
    )
    parser.add_argument(
        "--dir", default=".pgcdc", metavar="PATH",
        help="where the sandbox keeps its state, data and logs (default: ./.pgcdc)",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", title="actions")
    actions.required = True

    up = actions.add_parser("up", help="start PostgreSQL and S3 (a no-op when already up)")
    up.add_argument(
        "--flavour", "--flavor", choices=("pg18", "pg15"), default=None,
        help="pg18 (embedded PostgreSQL 18, pgoutput; the default) or pg15 (Debian "
        "PostgreSQL 15 with pglogical, wal2json and TLS)",
    )
    up.add_argument(
        "--spark", action="store_true",
        help="also start a Spark standalone cluster (a Master and 2 Workers, 1 core each, on "
        "127.0.0.1) and print its master URL; `env` then exports PGCDC_SPARK_MASTER",
    )
    up.set_defaults(handler=cmd_up)

    env = actions.add_parser("env", help="print the environment variables (with credentials)")
    env.add_argument(
        "--format", choices=("sh", "dotenv", "json"), default="sh",
        help="sh: `export K=V` lines for eval (default); dotenv: K=V lines; json: an object",
    )
    env.add_argument(
        "--airflow", action="store_true",
        help="also the AIRFLOW_CONN_* variables of the example DAGs' connections "
        "(pgcdc_postgres, pgcdc_s3, spark_default = the sandbox's Spark master when it was "
        "started with --spark, else local[2])",
    )
    env.set_defaults(handler=cmd_env)

    status = actions.add_parser("status", help="say whether the sandbox runs (exit 0 either way)")
    status.set_defaults(handler=cmd_status)

    down = actions.add_parser("down", help="stop the sandbox (safe to repeat)")
    down.add_argument("--purge", action="store_true", help="also delete its data, logs and state")
    down.set_defaults(handler=cmd_down)


def _sandbox(args: argparse.Namespace):
    from airflow_pgcdc.testing.sandbox import Sandbox

    return Sandbox(args.dir)


def redact(env: Mapping[str, str]) -> dict[str, str]:
    """The same variables with passwords and secret keys replaced by ``***``."""
    from airflow_pgcdc.errors import redact_mapping

    return redact_mapping(env)


def format_env(env: Mapping[str, str], fmt: str = "sh") -> str:
    if fmt == "json":
        return json.dumps(dict(env), indent=2)
    prefix = "export " if fmt == "sh" else ""
    return "\n".join(f"{prefix}{key}={shlex.quote(value)}" for key, value in env.items())


def cmd_up(args: argparse.Namespace) -> int:
    sandbox = _sandbox(args)
    if not sandbox.is_up():
        print(f"pgcdc sandbox: starting ({args.flavour or sandbox.flavour or 'pg18'}) ...", file=sys.stderr)
    env, started = sandbox.up(args.flavour, spark=args.spark)
    flavour = sandbox.flavour
    if started:
        print(f"pgcdc sandbox: up ({flavour}), state and logs in {sandbox.root}", file=sys.stderr)
    else:
        print(f"pgcdc sandbox: already up ({flavour}), state and logs in {sandbox.root}", file=sys.stderr)
    print(format_env(redact(env), "dotenv"), file=sys.stderr)
    if env.get("PGCDC_SPARK_MASTER"):
        print(f"pgcdc sandbox: Spark master {env['PGCDC_SPARK_MASTER']}", file=sys.stderr)
    print('pgcdc sandbox: to use it: eval "$(pgcdc sandbox env)"', file=sys.stderr)
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    env = _sandbox(args).env()
    if args.airflow:
        from airflow_pgcdc.testing.dagrun import sandbox_connections

        env = {**env, **sandbox_connections(env, spark_master=env.get("PGCDC_SPARK_MASTER", "local[2]"))}
    print(format_env(env, args.format))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    status = _sandbox(args).status()
    if not status["exists"]:
        print("no sandbox here")
        return 0

    def word(up: bool) -> str:
        return "running" if up else "stopped"

    spark = "" if status.get("spark") is None else f", spark {word(status['spark'])}"
    print(f"{status['flavour']}: postgres {word(status['postgres'])}, s3 {word(status['s3'])}{spark}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    stopped = _sandbox(args).down(purge=args.purge)
    what = "stopped" if stopped else "was not running"
    print(f"pgcdc sandbox: {what}" + ("; data purged" if args.purge else ""), file=sys.stderr)
    return 0
