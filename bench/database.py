"""The benchmark's own PostgreSQL database: create (or re-create) and migrate it, drop it, empty its
jobs tables, and load job rows in bulk (one COPY). Only BENCH_DB is ever created or dropped."""

from __future__ import annotations

import json
import time

from environment import BENCH_DB, BENCH_WORKDIR, SERVER
from world import World


def _admin_connection():
    import psycopg

    return psycopg.connect(
        host=SERVER.hostname or "127.0.0.1", port=SERVER.port or 5432, user=SERVER.username,
        password=SERVER.password, dbname="postgres", autocommit=True,
    )  # fmt: skip


# A database bench/year_world.py wrote carries this comment (COMMENT ON DATABASE). Writing it takes
# 15-30 min, and a benchmark that empties or drops BENCH_DB refuses it: bench_sync_portal.py run with
# BENCH_DB set to the year's once emptied its 650 000 jobs (truncate_jobs: TRUNCATE … CASCADE) and the
# year had to be written again (twenty-fifth session).
YEAR_MARK = "gpuportal bench: a year of a 1 000-GPU site, written by bench/year_world.py"
_MARK_OF = "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s"


class YearDatabase(RuntimeError):
    def __init__(self, what: str):
        super().__init__(
            f"{BENCH_DB} holds the year bench/year_world.py wrote, and this benchmark would {what} it: run it "
            f"with another BENCH_DB (its default: unset BENCH_DB), or write the year again afterwards"
        )


def _refuse_year(conn, what: str) -> None:
    row = conn.execute(_MARK_OF, [BENCH_DB]).fetchone()
    if row is not None and row[0] == YEAR_MARK:
        raise YearDatabase(what)


def year_mark() -> None:
    """Mark BENCH_DB as a year's (bench/year_world.py, once it is written)."""
    with _admin_connection() as conn:
        conn.execute(f"COMMENT ON DATABASE \"{BENCH_DB}\" IS '{YEAR_MARK}'")


def database_exists() -> bool:
    with _admin_connection() as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DB]).fetchone() is not None


def database_create(*, fresh: bool, year: bool = False) -> None:
    """Create the benchmark's database (dropping it first when ``fresh``; a year's only when ``year``:
    bench/year_world.py writing it again). Only BENCH_DB is ever dropped."""
    with _admin_connection() as conn:
        if fresh:
            if not year:
                _refuse_year(conn, "drop")
            conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DB]).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{BENCH_DB}"')


def database_drop() -> None:
    from django.db import connections

    connections.close_all()
    with _admin_connection() as conn:
        _refuse_year(conn, "drop")
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')


_ready = False


def setup(*, fresh: bool = False, year: bool = False) -> None:
    """Create (or re-create) and migrate the benchmark's database, then set Django up. Once per process.
    ``year``: bench/year_world.py's, which may re-create a year's database."""
    global _ready
    if _ready:
        return
    database_create(fresh=fresh, year=year)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    _ready = True


def truncate_jobs() -> None:
    """Empty the jobs tables (and what refers to them) in the benchmark's database."""
    from django.db import connection

    from jobs.models import Job, JobEvent

    with _admin_connection() as conn:
        _refuse_year(conn, "empty the jobs tables of")
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {JobEvent._meta.db_table}, {Job._meta.db_table} CASCADE")


# ---------------------------------------------------------------- bulk job rows


def make_job(world: World, **values):
    """An unsaved Job of the bench team/user, finished (COMPLETED) unless told otherwise."""
    from decimal import Decimal

    from django.utils import timezone

    from jobs.models import Job

    now = timezone.now()
    defaults = dict(  # noqa: C408 — keyword form reads like the model
        team=world.team, submitter=world.user, name="bench-history", script="#!/bin/bash\ntrue\n", partition="debug",
        gpus=1, time_limit_minutes=1, workdir=BENCH_WORKDIR, environment={}, state="COMPLETED",
        estimated_gpu_hours=Decimal("0.02"), created_at=now, submitted_at=now, started_at=now, ended_at=now,
        exit_code=0, relay_attempts=1, unix_uid=world.uid,
    )  # fmt: skip
    return Job(**(defaults | values))


def copy_jobs(jobs) -> float:
    """Insert Job rows with one COPY (every concrete column, as the model defines them), then VACUUM (ANALYZE). Seconds taken."""
    from django.db import connection, models

    from jobs.models import Job

    began = time.perf_counter()
    fields = Job._meta.concrete_fields
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    with connection.cursor() as cursor:
        with cursor.cursor.copy(f"COPY {Job._meta.db_table} ({columns}) FROM STDIN") as copy:
            for job in jobs:
                row = []
                for f in fields:
                    value = getattr(job, f.attname)
                    row.append(
                        json.dumps(value) if isinstance(f, models.JSONField) and value is not None else value
                    )
                copy.write_row(row)
        # what autovacuum does to a table after inserts: statistics, and the visibility map that lets
        # counts run as index-only scans
        cursor.execute(f"VACUUM (ANALYZE) {Job._meta.db_table}")
    return time.perf_counter() - began
