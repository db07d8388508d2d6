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


def templated(*values: str | None) -> bool:
    return any(v is not None and "{{" in v for v in values)


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
    operator's first AssetAlias outlet; a warning when it has neither."""
    outlets = list(operator.outlets or ())
    events = context["outlet_events"]
    for o in outlets:
        if isinstance(o, Asset) and o.uri == asset.uri:
            events[o].extra = extra
            return
    aliases = [o for o in outlets if isinstance(o, AssetAlias)]
    if aliases:
        events[aliases[0]].add(asset, extra=extra)
    else:
        operator.log.warning("no AssetAlias or Asset outlet for %s: no Asset event", asset.uri)
