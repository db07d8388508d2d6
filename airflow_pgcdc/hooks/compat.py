"""Airflow names that moved between the Airflow versions this provider supports (3.0 to
3.3): each imported from its Airflow 3.1+ home (the Task SDK), else from where 3.0 kept it.
The provider layer (hooks, triggers, operators, sensors, DAGs) imports them from here."""

from __future__ import annotations

try:  # Airflow >= 3.1
    from airflow.sdk import BaseHook
except ImportError:  # Airflow 3.0
    from airflow.hooks.base import BaseHook

try:  # Airflow >= 3.2
    from airflow.sdk.exceptions import (
        AirflowException,
        AirflowFailException,
        AirflowSkipException,
        TaskDeferred,
    )
except ImportError:  # Airflow 3.0, 3.1
    from airflow.exceptions import (
        AirflowException,
        AirflowFailException,
        AirflowSkipException,
        TaskDeferred,
    )

try:  # Airflow >= 3.2
    from airflow.sdk.observability.stats import Stats
except ImportError:  # Airflow 3.0, 3.1
    from airflow.stats import Stats

__all__ = ["AirflowException", "AirflowFailException", "AirflowSkipException", "BaseHook", "Stats", "TaskDeferred"]
