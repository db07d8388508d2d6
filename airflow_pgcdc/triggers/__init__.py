"""Airflow triggers: asyncio waits that run in the triggerer (no DSN or secret in their kwargs)."""
