"""``python -m airflow_pgcdc.cli``: the ``pgcdc`` command."""

import sys

from airflow_pgcdc.cli import main

sys.exit(main())
