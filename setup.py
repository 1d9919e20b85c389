"""The server's runtime dependencies: the one part of its metadata that is not in pyproject.toml.

The #SBATCH parser (sbatch/, the distribution gpuportal-sbatch) and the ``gpuportal`` command (cli/,
gpuportal-cli, which depends on the parser the same way) are required by their paths in this
checkout, as ``file:`` URLs: ``pip install .`` takes them from here and never asks a package index
for those names, where anyone may register them (pyproject.toml cannot say a path relative to
itself). tests/test_packaging.py checks it. Every other dependency is bounded above."""

from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent

setup(
    install_requires=[
        f"gpuportal-sbatch @ {(HERE / 'sbatch').as_uri()}",  # the #SBATCH parser (sbatch/)
        f"gpuportal-cli @ {(HERE / 'cli').as_uri()}",  # the `gpuportal` command (cli/)
        "Django>=5.2,<5.3",
        "djangorestframework>=3.15,<4",
        # Not 5.7.0: its worker exits ("Unrecoverable error: AttributeError 'NoneType' object has
        # no attribute 'hostname'") when the Redis connection drops with unacknowledged messages — the
        # consumer now close()s the connection after collect() has cleared its transport, and restoring
        # the unacked messages needs the transport. 5.6 with kombu 5.6 (redis-py 6.4) survives
        # (docs/reliability.md).
        "celery[redis]>=5.5,<5.7",
        "kombu>=5.5,<5.7",
        # imported by portal.outbox and portal.throttles (the outbox flags, the throttle's script), not
        # only through kombu: declared, so that a kombu that changed its client would not remove it
        "redis>=5,<7",
        # redis-py parses answers in C: ~20 % less CPU per command (cache, throttles, broker)
        "hiredis>=3,<4",
        "psycopg[binary]>=3.1,<4",
        # portal.db.bulk_update: one UPDATE … FROM (VALUES …) per batch through a maintained library
        # instead of Django's query compiler (issue 38; bench/results.md for why it is kept)
        "django-pgbulk>=3.3,<4",
        "drf-spectacular[sidecar]>=0.27,<1",
        "django-filter>=24,<27",
        "django-htmx>=1.17,<2",
        "gunicorn>=22,<28",
        "whitenoise>=6.6,<7",
        "prometheus-client>=0.20,<1",
        # the Kubernetes backend and scripts/k8s-node-agent: the official client. Only GA APIs of
        # Kubernetes 1.20 are used (core/v1, batch/v1, rbac/v1, coordination.k8s.io/v1), which every
        # client in this range speaks (tests/k8s runs them against the local 1.20.2 control plane).
        "kubernetes>=31,<38",
        "weasyprint>=66,<71",  # PDF invoices from the HTML invoice; system libraries and fonts: scripts/pdf
    ],
)
