"""The package's native parts (metadata is in pyproject.toml), both on the drain's hot
path: the pgoutput TupleData splitter of the window writer (airflow_pgcdc/typemap/decode/_textcols.c)
and the CopyData runs taken straight from libpq by the receive loop
(airflow_pgcdc/pg/_copyrun.c). Both are optional: without a C compiler the install goes on
and the pure-Python path of the same work is used (the same results, slower)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "airflow_pgcdc.typemap.decode._textcols",
            ["airflow_pgcdc/typemap/decode/_textcols.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "airflow_pgcdc.pg._copyrun",
            ["airflow_pgcdc/pg/_copyrun.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
