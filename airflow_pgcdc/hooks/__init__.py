"""Airflow hooks: connections in, library settings out."""
