# gpuportal — `make demo` runs the portal with a local Slurm cluster and demo data;
# `make test` runs the whole test suite. Both work on a new Debian machine as root.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export SLURM_CONF ?= $(or $(GPUPORTAL_CLUSTER_DIR),/var/lib/gpuportal-cluster)/etc/slurm.conf
DEMO_PASSWORD ?= gpuportal-demo
export DEMO_PASSWORD

.PHONY: demo stop test test-fast lint-imports install services cluster browser migrate bench clean-run help

help:
	@echo "make demo   — local Slurm cluster + web/worker/beat on http://127.0.0.1:8000 with demo data"
	@echo "make stop   — stop the demo processes (the cluster keeps running: scripts/cluster down)"
	@echo "make test   — the whole test suite on PostgreSQL against the local cluster"
	@echo "make test-fast — the pure and database tests only (no cluster, Celery worker or Chromium)"
	@echo "make bench  — benchmarks, figures in bench/results.md"

$(STAMP): pyproject.toml cli/pyproject.toml
	@command -v $(PYTHON) >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv python3-dev)
	@# python-ldap (gpuportal[ldap], in dev) compiles against these
	@bash -c 'source scripts/lib/common.sh && apt_ensure libldap2-dev libsasl2-dev gcc'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ./cli
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

services:
	@scripts/services up >/dev/null

cluster:
	@scripts/cluster up

browser:
	@scripts/browser >/dev/null

migrate: install
	$(PY) manage.py migrate --noinput

demo: install services cluster migrate
	$(PY) manage.py seed_demo
	$(PY) manage.py sync_cluster || true
	@scripts/demo start
	@echo
	@echo "gpuportal is running at http://127.0.0.1:8000/"
	@echo "  logins (password '$(DEMO_PASSWORD)'; set DEMO_PASSWORD to change):"
	@echo "    admin (staff) · finn (finance) · bob (manager, vision) · alice (member, vision) · dave (manager, nlp) · carol (member, nlp)"
	@echo "  API docs: http://127.0.0.1:8000/api/docs/   ·   logs: .run/log/   ·   stop: make stop"

stop:
	@scripts/demo stop

# Tests always run on PostgreSQL: the URL is the one scripts/services prints (it may carry a password).
test: install lint-imports cluster browser
	@eval "$$(scripts/services up)" && eval "$$(scripts/services ldap)" && $(PY) -m pytest $(PYTEST_ARGS)

# The dependency contracts of pyproject.toml ([tool.importlinter]); run before the tests
lint-imports: install
	@$(VENV)/bin/lint-imports --no-cache | sed -n "/^Contracts: /p;/BROKEN/,\$$p"; test "$${PIPESTATUS[0]}" = 0

# The fast tier: tests/conftest.py marks every test that needs no cluster, worker, browser or other
# local service `fast`. SLURM_CONF names no controller, so a test that reaches Slurm unmarked fails here.
test-fast: install lint-imports services
	@eval "$$(scripts/services up)" && SLURM_CONF=$(CURDIR)/tests/no-cluster.slurm.conf $(PY) -m pytest -m fast $(PYTEST_ARGS)

bench: install cluster
	@eval "$$(scripts/services up)" && $(PY) bench/run_all.py
