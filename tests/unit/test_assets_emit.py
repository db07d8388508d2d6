"""Where the operators' Asset event goes (operators.assets.emit): pure logic over the
operator's outlets and Airflow's outlet_events accessors (stood in for here)."""

from __future__ import annotations

import logging

from airflow.sdk import Asset, AssetAlias
from outlet_events import OutletEvents

from airflow_pgcdc.operators.assets import emit

ASSET = Asset("s3://bucket/cdc/slot1/snapshot")
EXTRA = {"rows": 3, "consistent_point": "0/1"}


class Accessor:
    def __init__(self):
        self.extra = {}
        self.added = []

    def add(self, asset, extra=None):
        self.added.append((asset.uri, extra))


class Events(OutletEvents):
    def __init__(self) -> None:
        super().__init__(Accessor)


class Op:
    def __init__(self, outlets):
        self.outlets = outlets
        self.log = logging.getLogger("test.assets")


def test_the_matching_asset_outlet_gets_the_extra():
    events = Events()
    emit(Op([Asset("s3://other"), Asset(ASSET.uri)]), {"outlet_events": events}, ASSET, EXTRA)
    assert events[Asset(ASSET.uri)].extra == EXTRA
    assert events[Asset("s3://other")].extra == {}


def test_an_alias_carries_the_event():
    events = Events()
    alias = AssetAlias(name="pgcdc-snapshot")
    emit(Op([alias]), {"outlet_events": events}, ASSET, EXTRA)
    assert events[alias].added == [(ASSET.uri, EXTRA)]


def test_user_declared_assets_carry_the_facts(caplog):
    events = Events()
    mine = Asset("my-warehouse-load")
    with caplog.at_level(logging.INFO, logger="test.assets"):
        emit(Op([mine]), {"outlet_events": events}, ASSET, EXTRA)
    assert events[mine].extra == EXTRA
    assert any("my-warehouse-load" in m and ASSET.uri in m for m in caplog.messages)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_no_outlet_warns(caplog):
    with caplog.at_level(logging.INFO, logger="test.assets"):
        emit(Op([]), {"outlet_events": Events()}, ASSET, EXTRA)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
