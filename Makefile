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
# The local Prometheus (scripts/prometheus: Debian's package, scraping the emulated GPU exporter of
# every node of both local clusters); the demo and the tests read it here.
GPUPORTAL_PROMETHEUS_PORT ?= 9090
export GPUPORTAL_PROMETHEUS_PORT
export PROMETHEUS_URL ?= http://127.0.0.1:$(GPUPORTAL_PROMETHEUS_PORT)

.PHONY: site stop-site wipe-site test-site demo stop test test-fast test-fuzz lint-imports install pyslurm services cluster cluster25 k8s browser migrate bench clean-run help cli-zipapp prometheus

help:
	@echo "make demo   — local Slurm cluster + web/worker/beat on http://127.0.0.1:8000 with demo data"
	@echo "make stop   — stop the demo processes (the cluster keeps running: scripts/cluster down)"
	@echo "scripts/demo status — the demo's processes, their restarts"
	@echo "make test   — the whole test suite on PostgreSQL against the local cluster"
	@echo "make k8s    — the local Kubernetes GPU cluster gpuportal-k8s (scripts/k8s; built once, ~7 min on 2 cores)"
	@echo "make prometheus — Prometheus + the emulated GPU exporter for the local clusters (part of demo and test)"
	@echo "make test-fast — the pure and database tests only (no cluster, Celery worker or Chromium)"
	@echo "make test-fuzz — the fuzz tests alone (schemathesis as each role, the API fuzz; part of make test)"
	@echo "make bench  — benchmarks, figures in bench/results.md"
	@echo "make site   — a small site with failover in network namespaces (scripts/site; issue 42); prints the load balancer's URL"
	@echo "make stop-site — take the site down (every process of its hosts; data kept)"
	@echo "make test-site — kill each host of the site under load and count what was lost (tests/site/drive.py)"
	@echo "make cli-zipapp — dist/gpuportal.pyz: the CLI as one file for any python3 >= 3.9"

$(STAMP): pyproject.toml setup.py cli/pyproject.toml cli/setup.py sbatch/pyproject.toml
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || (apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3 python3-venv python3-dev)
	@# python-ldap (gpuportal[ldap], in dev) compiles against these
	@bash -c 'source scripts/lib/common.sh && apt_ensure libldap2-dev libsasl2-dev gcc'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# gpuportal-sbatch and gpuportal-cli come from ./sbatch and ./cli by their paths (setup.py,
	@# cli/setup.py), never from an index; then editable, so that an edit of either needs no reinstall
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps -e ./sbatch -e ./cli
	@touch $(STAMP)

# scripts/pdf: WeasyPrint's system libraries, CJK fonts and pdftotext (installed when missing)
install: $(STAMP)
	@scripts/pdf

# The CLI as one file that runs with a bare python3 (>= 3.9): copy it to a login node.
cli-zipapp:
	$(PYTHON) cli/build_pyz.py dist/gpuportal.pyz

# Slurm 25.11 from ../shared/vendor's tarball (SLURM_SOURCE) and pyslurm built against it, both
# cached (scripts/pyslurm; ~12 min the first time on 2 cores). Exit 4 = no tarball: said loudly,
# the rest runs without 25.11. Not part of `make demo` (the demo runs the 22.05 cluster only).
pyslurm: $(STAMP)
	@scripts/pyslurm $(VENV) || [ $$? -eq 4 ]

cluster25:
	@scripts/cluster up --slurm 25.11 >/dev/null || [ $$? -eq 4 ]

# The local Kubernetes cluster gpuportal-k8s (scripts/k8s): Kubernetes 1.20.2 built from Debian 12's own
# source package the first time (~7 min on 2 cores; cached in /opt/gpuportal-k8s-<version>-<hash>, keyed
# by the package, Go and the patches of scripts/lib/k8s-patches), then etcd, the control plane and the
# emulated node agent of two GPU nodes. The node agent runs with this checkout's virtualenv.
k8s: install
	@scripts/k8s up >/dev/null

services:
	@scripts/services up >/dev/null

cluster:
	@scripts/cluster up

# Prometheus and the GPU exporter (after the clusters: the exporter serves the nodes of their gres.conf,
# and picks up a cluster that comes up later by itself)
prometheus:
	@scripts/prometheus up >/dev/null

browser:
	@scripts/browser >/dev/null

migrate: install
	@eval "$$(scripts/services up)" && $(PY) manage.py migrate --noinput

# scripts/demo start: PostgreSQL + Redis, migrate, static files, demo data, then the web server (gunicorn), the Celery
# worker and beat under scripts/supervise; it prints the URL and the logins.
demo: install cluster prometheus
	@scripts/demo start

stop:
	@scripts/demo stop

# Tests always run on PostgreSQL: the URL is the one scripts/services prints (it may carry a password).
# k8s: tests/k8s run against the local Kubernetes cluster (the first run builds it: ~7 min on 2 cores).
test: install lint-imports pyslurm cluster cluster25 k8s prometheus browser
	@eval "$$(scripts/services up)" && eval "$$(scripts/services ldap)" && $(PY) -m pytest $(PYTEST_ARGS)

# The dependency contracts of pyproject.toml ([tool.importlinter]); run before the tests
lint-imports: install
	@$(VENV)/bin/lint-imports --no-cache | sed -n "/^Contracts: /p;/BROKEN/,\$$p"; test "$${PIPESTATUS[0]}" = 0

# The fast tier: tests/conftest.py marks every test that needs no cluster, worker, browser or other
# local service `fast`. SLURM_CONF names no controller, so a test that reaches Slurm unmarked fails here.
# One pytest-xdist worker per core (FAST_WORKERS): the fast tests share nothing but PostgreSQL and Redis,
# and each worker has its own test database and cache prefix (tests/conftest.py).
# The tests run in a new order each time (pytest-random-order, the whole tier as one bucket), so a
# test that leans on what another left behind fails here; the seed is printed at the top of the run:
# `make test-fast FAST_SEED=<seed>` runs that order again.
FAST_WORKERS ?= auto
ifndef FAST_SEED
FAST_SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
test-fast: install lint-imports services
	@echo "test-fast: tests in the order of seed $(FAST_SEED) (make test-fast FAST_SEED=$(FAST_SEED) runs it again)"
	@eval "$$(scripts/services up)" && SLURM_CONF=$(CURDIR)/tests/no-cluster.slurm.conf $(PY) -m pytest -m fast -n $(FAST_WORKERS) \
		--random-order-bucket=global --random-order-seed=$(FAST_SEED) $(PYTEST_ARGS)

# The fuzz tests alone (schemathesis as each role, the API fuzz: `-m fuzz`, part of `make test`): they need
# PostgreSQL and Redis only, and CI runs them beside the Slurm tests, in their own test database.
test-fuzz: install services
	@eval "$$(scripts/services up)" && $(PY) -m pytest -m fuzz $(PYTEST_ARGS)

# The tests against the local Kubernetes cluster alone (`-m k8s`, part of `make test`): its control plane, the
# node agent, PostgreSQL, Redis and Celery workers on queues of this run's own; no Slurm job. CI runs them
# beside the Slurm tests, after the fuzz tests, in their own pytest process and test database.
test-k8s: install k8s services
	@eval "$$(scripts/services up)" && $(PY) -m pytest -m k8s $(PYTEST_ARGS)

bench: install pyslurm cluster cluster25
	@eval "$$(scripts/services up)" && $(PY) bench/run_all.py

# A small site with failover on this machine (scripts/site, issue 42): two portal hosts behind HAProxy,
# PostgreSQL under pg_auto_failover, Redis with three sentinels, slurmctld on two hosts, each host a
# network namespace. Ends by printing the load balancer's URL.
site: $(STAMP)
	@scripts/site up

stop-site:
	@scripts/site down

# the site's data removed (make test-site starts from a new site: a run's leftovers are not the next's)
wipe-site:
	@scripts/site wipe

# Each host of the site killed in turn under load (API, CLI, the job form in Chromium), with what clients
# saw and what was lost (tests/site/drive.py; figures in docs/reliability.md). Brings the site up first.
test-site: wipe-site site browser
	@$(PY) tests/site/drive.py
