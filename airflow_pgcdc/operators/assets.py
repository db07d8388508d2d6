"""Asset outlets of the pgcdc operators, with or without templated locations.

An operator whose location (``to``, ``slot``) is known when the DAG is parsed declares the
``Asset`` itself as its outlet; when the location is templated (``{{ params.store }}``:
known only at run time) it declares an ``AssetAlias`` (``pgcdc-<kind>``, or
``pgcdc-<kind>-<slot>`` when the slot is static) and adds the event for the resolved
Asset through it at run time. Consumers schedule on the Asset (its uri is stable:
``s3://bucket/prefix/<slot>/snapshot``, ``…/<slot>/changes``, a Delta table's location)
or on the alias.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import Asset, AssetAlias

from airflow_pgcdc.operators.values import templated


def alias(kind: str, slot: str | None = None) -> AssetAlias:
    """``pgcdc-<kind>-<slot>``, or ``pgcdc-<kind>`` when the slot is only known at run time."""
    if slot and not templated(slot):
        return AssetAlias(name=f"pgcdc-{kind}-{slot}")
    return AssetAlias(name=f"pgcdc-{kind}")


def default_outlets(kind: str, to: str, slot: str, asset) -> list:
    """``[asset(to, slot)]`` when both are static, else ``[alias(kind, slot)]``."""
    if templated(to, slot):
        return [alias(kind, slot)]
    return [asset(to, slot)]


def emit(operator, context: Mapping[str, Any], asset: Asset, extra: dict[str, Any]) -> None:
    """The Asset event for ``asset``: on the outlet declaring that uri, else through the
    operator's first AssetAlias outlet. With neither, the Asset outlets the user declared
    instead (Airflow emits their events anyway) carry ``extra``, and the log says that
    ``asset`` itself gets no event; a warning when the operator has no outlet at all."""
    outlets = list(operator.outlets or ())
    events = context["outlet_events"]
    for o in outlets:
        if isinstance(o, Asset) and o.uri == asset.uri:
            events[o].extra = extra
            return
    aliases = [o for o in outlets if isinstance(o, AssetAlias)]
    declared = [o for o in outlets if isinstance(o, Asset)]
    if aliases:
        events[aliases[0]].add(asset, extra=extra)
    elif declared:
        for o in declared:
            events[o].extra = extra
        operator.log.info(
            "the declared outlet(s) %s carry this run's facts; %s gets no event of its own "
            "(declare it, or an AssetAlias, as an outlet for that)",
            ", ".join(o.uri for o in declared), asset.uri,
        )
    else:
        operator.log.warning("the operator has no outlet: no Asset event for %s", asset.uri)
