"""The package's one native part (metadata is in pyproject.toml): the pgoutput TupleData
splitter of the drain's writer (airflow_pgcdc/changes/_textcols.c). It is optional: without
a C compiler the install goes on and the pure-Python path of the same function is used
(airflow_pgcdc.changes.tuples says which one runs)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "airflow_pgcdc.changes._textcols",
            ["airflow_pgcdc/changes/_textcols.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
