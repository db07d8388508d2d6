"""Airflow operators: one unit of work each, thin wrappers over the library calls."""
