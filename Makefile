# The README's two commands: `make demo` and `make test`. Both set up what they need,
# idempotently: Debian packages (PostgreSQL 15 + pglogical + wal2json), the .venv with
# the pinned lock file, and the package itself in editable mode.
SHELL := /bin/bash
PY_BOOT ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
APT_PKGS := postgresql-15 postgresql-15-pglogical postgresql-15-wal2json
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test demo setup apt lint bench clean bytecode

setup: apt $(STAMP)

apt:
	@missing=""; for p in $(APT_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

$(STAMP): requirements/lock.txt pyproject.toml
	@[ -x $(PY) ] || $(PY_BOOT) -m venv $(VENV)
	@[ -x $(VENV)/bin/uv ] || $(VENV)/bin/pip install -q --disable-pip-version-check uv==0.13.9
	@echo "installing pinned Python dependencies into $(VENV)"
	@$(VENV)/bin/uv pip install -q --python $(PY) --compile-bytecode -r requirements/lock.txt
	@$(VENV)/bin/uv pip install -q --python $(PY) --no-deps -e .
	@touch $(STAMP)
	@$(MAKE) -s bytecode

# Byte-compile our own sources (the lock install above compiles the dependencies, as pip
# does by default): with PYTHONDONTWRITEBYTECODE set, every process would otherwise
# recompile them at import. Up-to-date files are skipped.
bytecode:
	@$(PY) -m compileall -q -j 0 airflow_pgcdc dags >/dev/null

test: setup bytecode
	@SPARK_LOCAL_IP=127.0.0.1 $(PY) -m pytest $(PYTEST_ARGS)

demo: setup bytecode
	@SPARK_LOCAL_IP=127.0.0.1 $(PY) -m airflow_pgcdc.demo

lint: setup
	@$(VENV)/bin/ruff check airflow_pgcdc tests bench

bench: setup bytecode
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pgcdc .pytest_cache
