"""A portal process for tests/faults/test_failover_postgres.py: Django set up from the environment
(DATABASE_URL: the multi-host URL under test), answering one JSON command per line on stdin with one
JSON line on stdout. Each command is one request as Django's handler frames it: ``request_started``
(Django's close_old_connections: with CONN_HEALTH_CHECKS a persistent connection is checked before
the request's first query and replaced when dead), the ORM work, ``request_finished``.

- {"op": "setup"}: the sessions table (Django's own model; schema_editor.create_model), once.
- {"op": "request", "key": K}: a session row K written; the server's port and whether it is a standby.
- {"op": "hold", "key": K}: the same write inside a transaction left open, answered at once; the next
  line ({"op": "release"}) commits it: a request in flight when the primary dies.
- {"op": "beat"}: one lease claim of this process's beat scheduler (portal.beat.LeaderScheduler, as its
  tick does it, outside any request): whether it holds the lease and for how much longer.
GPUPORTAL_TEST_NO_HEALTH_CHECKS=1 turns CONN_HEALTH_CHECKS off (the control: what the setting saves)."""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import sys
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.project.settings")
django.setup()

from django.contrib.sessions.models import Session
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from portal.models import Lease

if os.environ.get("GPUPORTAL_TEST_NO_HEALTH_CHECKS") == "1":
    connection.settings_dict["CONN_HEALTH_CHECKS"] = False


def reply(**answer) -> None:
    print(json.dumps(answer), flush=True)


def write(key: str) -> dict:
    Session.objects.create(session_key=key, session_data="x", expire_date=timezone.now() + dt.timedelta(days=1))
    with connection.cursor() as cursor:
        cursor.execute("SELECT inet_server_port(), pg_is_in_recovery()")
        port, standby = cursor.fetchone()
    return {"port": port, "standby": standby}


@functools.cache
def beat_scheduler():
    from portal.beat import LeaderScheduler
    from portal.project.celery import app

    return LeaderScheduler(app=app, lazy=True, schedule_filename=os.devnull)  # lazy: no schedule file opened


def main() -> None:
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "beat":  # not a request: beat has none
            scheduler = beat_scheduler()
            scheduler._claim()  # what its tick does every BEAT_LEASE_SECONDS / 3; a database error is logged
            reply(ok=True, holding=scheduler.holding, held_for=round(scheduler.held_until - time.monotonic(), 2))
            continue
        request_started.send(sender=WSGIHandler, environ={})
        try:
            if command["op"] == "setup":
                with connection.schema_editor() as editor:
                    editor.create_model(Session)
                    editor.create_model(Lease)
                reply(ok=True)
            elif command["op"] == "request":
                reply(ok=True, **write(command["key"]))
            elif command["op"] == "hold":
                with transaction.atomic():
                    answer = write(command["key"])
                    reply(ok=True, held=True, **answer)
                    json.loads(sys.stdin.readline())  # {"op": "release"}: commit
                reply(ok=True)
        except DatabaseError as exc:
            reply(ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
        finally:
            request_finished.send(sender=WSGIHandler)


if __name__ == "__main__":
    main()
