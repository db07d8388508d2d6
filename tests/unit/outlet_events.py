"""A stand-in for Airflow's ``context["outlet_events"]`` in unit tests of operators."""

from __future__ import annotations


class OutletEvents(dict):
    """Accessors made by ``accessor()`` on first use, keyed by what names an asset or an
    alias (Airflow 3.1's ``AssetAlias`` is not hashable; its accessor does not hash it)."""

    def __init__(self, accessor) -> None:
        super().__init__()
        self._accessor = accessor

    def __getitem__(self, key):
        k = (type(key).__name__, getattr(key, "name", None), getattr(key, "uri", None))
        if not dict.__contains__(self, k):
            dict.__setitem__(self, k, self._accessor())
        return dict.__getitem__(self, k)
