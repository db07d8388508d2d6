"""Airflow sensors: wait for a condition on the source, deferrable to the triggerer."""
