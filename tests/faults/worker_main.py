"""Start a Celery worker for the fault tests with a short relay lease.

The relay's claim on a job (``jobs.services.relay.RELAY_LEASE_SECONDS``, 120 s in production, longer than
the task's hard time limit) is what keeps a second relay away from a job whose relay might still be
running. After a SIGKILL the claim of the relay that died holds until it expires, so the fault tests
shorten it (GPUPORTAL_TEST_RELAY_LEASE_SECONDS) to keep their runtime down. The worker runs with
SLURM_TIMEOUT small enough that a relay (at most three Slurm calls) always ends within the lease.
Everything else is the production worker: ``python -m tests.faults.worker_main -A portal.project worker …``."""

from __future__ import annotations

import os
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.project.settings")
django.setup()

from jobs.services import relay

relay.RELAY_LEASE_SECONDS = int(os.environ.get("GPUPORTAL_TEST_RELAY_LEASE_SECONDS", relay.RELAY_LEASE_SECONDS))

from celery.bin.celery import main

if __name__ == "__main__":
    sys.argv[0] = "celery"
    sys.exit(main())
