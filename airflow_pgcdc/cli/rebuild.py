"""``pgcdc rebuild``: rebuild Delta tables from the store and swap them into the live root."""

from __future__ import annotations


def register(subparsers) -> None:
    from airflow_pgcdc.cli.merge import add_spark_arguments, run
    from airflow_pgcdc.merge.spark_app import add_arguments, add_rebuild_arguments

    p = subparsers.add_parser(
        "rebuild",
        help="rebuild Delta tables from the store (copy + every window) and swap them in",
        description=(
            "Replay the slot's copy and committed windows into a scratch Delta root "
            "({delta}_rebuild/{run id}), then swap each rebuilt table (and its changelog or SCD2 "
            "history table) into the live root under --delta in one overwrite commit: readers see "
            "the old contents or the new, time travel keeps the old. The scratch root is removed "
            "after. Refused before any work when pgcdc maintain removed windows or a copy the "
            "rebuild needs (the error names the tables and the retention that would have kept "
            "them). The same options as pgcdc merge choose the rebuilt tables' engine and layout "
            "(--engine, --target-file-mb, --deletion-vectors, --history). Prints the result as JSON."
        ),
    )
    add_arguments(p)
    add_rebuild_arguments(p, flag=False)
    add_spark_arguments(p)
    p.set_defaults(handler=run, rebuild=True)
