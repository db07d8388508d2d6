"""Operator arguments renamed for one vocabulary (``store`` for the change store's URL, as
the CLI's ``--store``): the old keyword keeps working for one release, with a warning."""

from __future__ import annotations

import warnings
from typing import Any

from airflow.exceptions import AirflowProviderDeprecationWarning

__all__ = ["renamed_argument"]


def renamed_argument(kwargs: dict[str, Any], old: str, new: str, value: Any, owner: str, *,
                     required: str | None = "the change store, s3://bucket/prefix") -> Any:
    """``value`` (the argument ``new``), or the value given under its old name ``old``
    (taken out of ``kwargs``, with an :class:`AirflowProviderDeprecationWarning`). Both is a
    :class:`TypeError` naming the operator, and so is neither unless ``required`` is
    ``None`` (else it says what is missing)."""
    if old in kwargs:
        if value is not None:
            raise TypeError(f"{owner}: give {new}= only ({old}= is its former name)")
        warnings.warn(
            f"{owner}({old}=...) is now {owner}({new}=...); {old}= goes in the next release",
            AirflowProviderDeprecationWarning,
            stacklevel=3,
        )
        value = kwargs.pop(old)
    if value is None and required is not None:
        raise TypeError(f"{owner} needs {new}= ({required})")
    return value
