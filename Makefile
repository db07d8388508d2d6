# The README's two commands: `make demo` and `make test`. Both set up what they need,
# idempotently: Debian packages (PostgreSQL 15 + pglogical + wal2json), the .venv with
# the pinned lock file, the package itself in editable mode, and the JVM jars of the
# delta-spark engine and the s3a reader (jvm/pom.xml, fetched with mvn into jvm/jars).
SHELL := /bin/bash
PY_BOOT ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
APT_PKGS := postgresql-15 postgresql-15-pglogical postgresql-15-wal2json gcc libc6-dev
# the native TupleData splitter (setup.py) compiles against the headers of the venv's Python:
# Debian's own python3 has them in python3-dev (pyenv's and python.org's builds carry them)
PY_HEADERS := $(shell $(PY_BOOT) -c "import os, sysconfig; print(int(os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))))" 2>/dev/null)
ifeq ($(PY_HEADERS),0)
APT_PKGS += python3-dev
endif
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
JARS := jvm/jars
MVN ?= mvn
JARS_STAMP := $(JARS)/.complete
HMS_LIB := jvm/hms/lib
HMS_STAMP := $(HMS_LIB)/.complete

.PHONY: test demo demo-lake setup apt jars hms lint bench clean bytecode

# The floor environment: the package's declared floors (pyproject.toml), resolved lowest
# first into requirements/floor.txt as a team on the lowest Airflow would have installed
# them: every other package as of that Airflow's release (the command is at the top of the
# file). `make test` runs the unit tests there again, and the tests that run real DAGs
# (FLOOR_AIRFLOW_TESTS, against the same servers); FLOOR=0: not. The unit test of first
# imports is left out there: Airflow 3.0 logs its plugins on stderr at import.
FLOOR ?= 1
FLOOR_VENV := .venv-floor
FLOOR_PY := $(FLOOR_VENV)/bin/python
FLOOR_STAMP := $(if $(filter-out 0,$(FLOOR)),$(FLOOR_VENV)/.installed)
FLOOR_AIRFLOW_TESTS := tests/integration/test_dags.py tests/integration/test_dag_factory_airflow.py \
  tests/integration/test_dag_maintenance.py tests/integration/test_operator_merge.py \
  tests/integration/test_operator_merge_partial.py tests/integration/test_changes_sensor.py \
  tests/integration/test_hook_connection.py

setup: apt $(STAMP) jars hms

apt:
	@missing=""; for p in $(APT_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

$(STAMP): requirements/lock.txt pyproject.toml setup.py airflow_pgcdc/typemap/decode/_textcols.c airflow_pgcdc/pg/_copyrun.c
	@[ -x $(PY) ] || $(PY_BOOT) -m venv $(VENV)
	@[ -x $(VENV)/bin/uv ] || $(VENV)/bin/pip install -q --disable-pip-version-check uv==0.13.9
	@echo "installing pinned Python dependencies into $(VENV)"
	@$(VENV)/bin/uv pip install -q --python $(PY) --compile-bytecode -r requirements/lock.txt
	@$(VENV)/bin/uv pip install -q --python $(PY) --no-deps -e .
	@$(PY) -c "import airflow_pgcdc.typemap.decode._textcols, airflow_pgcdc.pg._copyrun" 2>/dev/null || \
	  echo "warning: the native parts (setup.py) were not built (no C compiler?): the drain uses its slower Python paths"
	@touch $(STAMP)
	@$(MAKE) -s bytecode

# Delta Lake's Spark engine, hadoop-aws and the AWS SDK bundle (~700 MB, once), for
# `--engine delta-spark` / `--reader s3a` (airflow_pgcdc/merge/jars.py finds them here).
# Without mvn or without the registry (an offline machine) this warns and goes on:
# everything else works, and the delta-spark/s3a tests skip, saying why
# (jvm/jars-error.txt). The next `make` tries again.
jars: $(JARS_STAMP)

$(JARS_STAMP): jvm/pom.xml
	@rm -f jvm/jars-error.txt; \
	if ! command -v $(firstword $(MVN)) >/dev/null 2>&1; then \
	  echo "mvn is not installed (apt-get install maven)" > jvm/jars-error.txt; \
	  echo "warning: mvn not found: the delta-spark/s3a jars are not fetched (their tests will skip)"; \
	  exit 0; \
	fi; \
	echo "fetching the pinned JVM jars (jvm/pom.xml: Delta, hadoop-aws, AWS SDK) into $(JARS)"; \
	rm -rf $(JARS).tmp; \
	if $(MVN) -q -B -f jvm/pom.xml dependency:copy-dependencies -DoutputDirectory=$(CURDIR)/$(JARS).tmp \
	     > jvm/mvn.log 2>&1; then \
	  rm -rf $(JARS) && mv $(JARS).tmp $(JARS) && touch $(JARS_STAMP) && rm -f jvm/mvn.log; \
	else \
	  rm -rf $(JARS).tmp; sed 's/\x1b\[[0-9;]*m//g' jvm/mvn.log | grep -m1 -E "ERROR" > jvm/jars-error.txt; \
	  echo "warning: mvn could not fetch the delta-spark/s3a jars (see jvm/mvn.log); their tests will skip"; \
	fi

# A standalone Hive Metastore 4.0.1 (jvm/hms/pom.xml: the metastore and the Hadoop jars it
# needs, ~85 MB, once) for the catalog's tests (airflow_pgcdc/testing/hms.py starts it on
# embedded Derby), and the Hive 4.0.1 client Spark loads to read tables by name from it
# (jvm/hms/client/pom.xml, ~170 MB: Spark's built-in Hive 2.3 client calls get_table, which
# Hive 4 removed). Without them the catalog tests skip, saying why (jvm/hms-error.txt).
hms: $(HMS_STAMP)

$(HMS_STAMP): jvm/hms/pom.xml
	@rm -f jvm/hms-error.txt; \
	if ! command -v $(firstword $(MVN)) >/dev/null 2>&1; then \
	  echo "mvn is not installed (apt-get install maven)" > jvm/hms-error.txt; exit 0; \
	fi; \
	echo "fetching the Hive Metastore's jars (jvm/hms/pom.xml) and Spark's Hive 4 client (jvm/hms/client/pom.xml)"; \
	rm -rf $(HMS_LIB).tmp; \
	if $(MVN) -q -B -f jvm/hms/pom.xml dependency:copy-dependencies -DoutputDirectory=$(CURDIR)/$(HMS_LIB).tmp \
	     > jvm/hms-mvn.log 2>&1 && \
	   $(MVN) -q -B -f jvm/hms/client/pom.xml dependency:copy-dependencies \
	     -DoutputDirectory=$(CURDIR)/$(HMS_LIB).tmp/client >> jvm/hms-mvn.log 2>&1; then \
	  rm -rf $(HMS_LIB) && mv $(HMS_LIB).tmp $(HMS_LIB) && touch $(HMS_STAMP) && rm -f jvm/hms-mvn.log; \
	else \
	  rm -rf $(HMS_LIB).tmp; sed 's/\x1b\[[0-9;]*m//g' jvm/hms-mvn.log | grep -m1 -E "ERROR" > jvm/hms-error.txt; \
	  echo "warning: mvn could not fetch the Hive Metastore (see jvm/hms-mvn.log); the catalog tests will skip"; \
	fi

# Byte-compile our own sources (the lock install above compiles the dependencies, as pip
# does by default): with PYTHONDONTWRITEBYTECODE set, every process would otherwise
# recompile them at import. Up-to-date files are skipped.
bytecode:
	@$(PY) -m compileall -q -j 0 airflow_pgcdc dags >/dev/null

# Two pytest workers (pytest-xdist), each with its own servers: a run spends about half its
# time waiting on servers, JVMs and subprocesses, so the 2-core machine has a core idle
# while one worker waits. The Spark-cluster module's xdist_group keeps it on one worker
# (tests/conftest.py carries the group into the node id, which pytest-xdist 3.8 misses under
# pytest 9).
# PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2
test: setup bytecode $(FLOOR_STAMP)
	@SPARK_LOCAL_IP=127.0.0.1 $(PY) -m pytest $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadgroup) $(PYTEST_ARGS)
ifneq ($(FLOOR),0)
	@echo "== the unit tests and the real DAG runs on the lowest supported versions (requirements/floor.txt: Airflow 3.0)"
	@SPARK_LOCAL_IP=127.0.0.1 $(FLOOR_PY) -m pytest -q -p no:cacheprovider \
	  $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadgroup) tests/unit $(FLOOR_AIRFLOW_TESTS) \
	  --deselect tests/unit/test_import_graph.py::test_every_module_imports_when_it_is_the_first_one_imported
endif

$(FLOOR_VENV)/.installed: requirements/floor.txt $(STAMP)
	@[ -x $(FLOOR_PY) ] || $(PY_BOOT) -m venv $(FLOOR_VENV)
	@$(VENV)/bin/uv pip sync -q --python $(FLOOR_PY) requirements/floor.txt
	@$(VENV)/bin/uv pip install -q --python $(FLOOR_PY) --no-deps -e .
	@touch $@

demo: setup bytecode
	@SPARK_LOCAL_IP=127.0.0.1 $(PY) -m airflow_pgcdc.testing.demo --dags dags

# After `make demo`, on the sandbox it left up: what lake consumers get (a Hive Metastore, tables
# by name in Spark SQL, the change feed, soft deletes, CDC metadata columns, a hashed column),
# on a slot, store and lake of its own (airflow_pgcdc/testing/demo_lake.py).
demo-lake: setup bytecode
	@SPARK_LOCAL_IP=127.0.0.1 $(PY) -m airflow_pgcdc.testing.demo_lake

lint: setup
	@$(VENV)/bin/ruff check airflow_pgcdc tests bench

bench: setup bytecode
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) $(FLOOR_VENV) .pgcdc .pytest_cache $(JARS) jvm/mvn.log jvm/jars-error.txt $(HMS_LIB) jvm/hms-mvn.log jvm/hms-error.txt
