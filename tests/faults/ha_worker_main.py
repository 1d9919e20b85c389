"""A Celery worker for the failover tests (tests/faults/test_failover_redis.py): the production worker
(``python -m tests.faults.ha_worker_main -A portal.project worker …``) with one test task more,
``tests.faults.ha_echo``, which writes its token into the Django cache: a message that went through the
broker and a cache write from the worker's own process, both on the Redis master the Sentinels name."""

from __future__ import annotations

import os
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.project.settings")
django.setup()

from celery.bin.celery import main
from django.core.cache import cache

from portal.project.celery import app


@app.task(name="tests.faults.ha_echo")
def ha_echo(token: str) -> None:
    cache.set(f"ha-echo:{token}", os.getpid(), timeout=300)


if __name__ == "__main__":
    sys.argv[0] = "celery"
    sys.exit(main())
