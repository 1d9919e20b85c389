"""portal.db: bulk_update (django-pgbulk's one UPDATE … FROM (VALUES …) per batch writes what
bulk_update would — every field type the jobs use, NULLs, JSON — in a number of queries that does not
grow with the rows), COPY inserts and upserts that write what bulk_create would, and any_of (one array parameter for an IN list); and the connection's health check."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job
from portal import db as portal_db
from portal.db import any_of, bulk_insert_copy, bulk_update, bulk_upsert_copy

pytestmark = pytest.mark.django_db


def _jobs(world, n, *, state=JobState.ACCEPTED):
    return [
        Job.objects.create(
            team=world.vision, submitter=world.alice, name=f"b{i}", script="#!/bin/bash\ntrue\n", partition="gpu",
            gpus=1, time_limit_minutes=5, workdir="/tmp", state=state, estimated_gpu_hours=1,
            relay_token=uuid.uuid4(), relay_started_at=timezone.now(), environment={"A": "1"},
        )  # fmt: skip
        for i in range(n)
    ]


@pytest.mark.parametrize("path", ["values", "copy"])
def test_writes_each_rows_own_values_of_every_field_type(world, path, monkeypatch):
    """Both ways bulk_update writes: one UPDATE … FROM (VALUES …), or (from BULK_UPDATE_COPY_FROM rows)
    COPY into a temporary table and one UPDATE … FROM it."""
    import portal.db

    monkeypatch.setattr(portal.db, "BULK_UPDATE_COPY_FROM", 1000 if path == "values" else 1)
    jobs = _jobs(world, 3)
    at = timezone.now().replace(microsecond=123456) - dt.timedelta(hours=1)
    for i, job in enumerate(jobs):
        job.state = JobState.PENDING
        job.slurm_job_id = 9_000_000_000 + i  # bigint
        job.submitted_at = at + dt.timedelta(seconds=i)
        job.relay_token = None  # uuid → NULL
        job.environment = {"X": str(i), "quote": "it's \"here\""}  # jsonb
        job.estimated_cost = Decimal("1.25") * (i + 1)  # numeric
        job.unix_uid = 1000 + i
        job.state_reason = "" if i else "with 'quotes' and ; semicolons"
    fields = ["state", "slurm_job_id", "submitted_at", "relay_token", "environment", "estimated_cost", "unix_uid", "state_reason"]
    with CaptureQueriesContext(connection) as queries:
        written = bulk_update(Job, jobs, fields)
    assert written == 3
    assert any(q["sql"].startswith("COPY") for q in queries.captured_queries) == (path == "copy")
    for i, job in enumerate(jobs):
        row = Job.objects.get(pk=job.pk)
        assert row.state == JobState.PENDING
        assert row.slurm_job_id == 9_000_000_000 + i
        assert row.submitted_at == at + dt.timedelta(seconds=i)
        assert row.relay_token is None
        assert row.environment == {"X": str(i), "quote": "it's \"here\""}
        assert row.estimated_cost == Decimal("1.25") * (i + 1)
        assert row.unix_uid == 1000 + i
        assert row.state_reason == ("" if i else "with 'quotes' and ; semicolons")
        assert row.relay_started_at is not None  # a field not named is untouched


def test_one_statement_per_batch_whatever_the_rows(world):
    jobs = _jobs(world, 25)
    for job in jobs:
        job.state_reason = f"r-{job.pk}"
    with CaptureQueriesContext(connection) as queries:
        written = bulk_update(Job, jobs, ["state_reason"], batch_size=10)
    assert written == 25
    assert len(queries) == 3  # 10 + 10 + 5
    assert all(sql["sql"].startswith('UPDATE "jobs_job"') for sql in queries.captured_queries)
    assert {j.state_reason for j in Job.objects.all()} == {f"r-{job.pk}" for job in jobs}


def test_no_rows_no_query_and_an_unknown_field_is_refused(world):
    with CaptureQueriesContext(connection) as queries:
        assert bulk_update(Job, [], ["state"]) == 0
    assert len(queries) == 0
    jobs = _jobs(world, 1)
    with pytest.raises(KeyError, match="nope"):
        bulk_update(Job, jobs, ["nope"])


# ---------------------------------------------------------------- bulk_insert_copy, bulk_upsert_copy, any_of


def test_copy_insert_writes_every_field_and_leaves_generated_ids_to_the_sequence(world):
    from jobs.models import JobEvent

    jobs = [
        Job(team=world.vision, submitter=world.alice, name=f"c{i}", script="#!/bin/bash\necho 'x'\n", partition="gpu",
            gpus=2, time_limit_minutes=5, workdir="/tmp", environment={"K": f"v{i}", "Q": "a'b\tc\nd"},
            estimated_gpu_hours=Decimal("1.50"), estimated_cost=None)
        for i in range(3)
    ]  # fmt: skip
    before = timezone.now()
    assert bulk_insert_copy(jobs) == 3
    for i, job in enumerate(jobs):
        row = Job.objects.get(pk=job.pk)  # the UUID made in Python is the row's key
        assert row.environment == {"K": f"v{i}", "Q": "a'b\tc\nd"} and row.script == "#!/bin/bash\necho 'x'\n"
        assert (row.gpus, row.estimated_gpu_hours, row.estimated_cost) == (2, Decimal("1.50"), None)
        assert row.created_at >= before  # auto_now_add filled in, as bulk_create does
    events = [JobEvent(job=job, state=JobState.ACCEPTED, reason="r", at=timezone.now()) for job in jobs]
    assert bulk_insert_copy(events) == 3
    ids = list(JobEvent.objects.filter(job__in=jobs).values_list("id", flat=True))
    assert len(set(ids)) == 3 and all(ids)  # BigAutoField ids from the sequence


def test_copy_upsert_inserts_new_rows_updates_existing_ones_and_sets_each_objects_id(world):
    from portal.models import Membership, Role

    existing = Membership.objects.get(team=world.vision, user=world.alice)
    assert existing.role == Role.MEMBER
    rows = [
        Membership(team=world.vision, user=world.alice, role=Role.MANAGER),  # conflicts: updated
        Membership(team=world.nlp, user=world.alice, role=Role.MEMBER),  # new
    ]
    count = Membership.objects.count()
    bulk_upsert_copy(rows, unique_fields=["team", "user"], update_fields=["role"])
    assert Membership.objects.count() == count + 1
    assert rows[0].pk == existing.pk and Membership.objects.get(pk=existing.pk).role == Role.MANAGER
    assert rows[1].pk is not None and Membership.objects.get(pk=rows[1].pk).team == world.nlp


def test_copy_upsert_writes_what_bulk_create_writes_plain_values_or_not(world):
    """The COPY rows skip get_db_prep_save only for a plain field's own type: a JSON field holding a
    string, a choices enum, a numeric string for an integer, a Decimal and None are written as
    bulk_create writes them (the same rows read back)."""
    def rows(prefix):
        return [
            Job(id=uuid.uuid4(), team=world.vision, submitter=world.alice, name=f"{prefix}{i}", script="#!/bin/bash\ntrue\n",
                partition="gpu", gpus=["2", 3][i], time_limit_minutes=5, workdir="/tmp", state=JobState.PENDING,
                environment=["just a string", {"A": "1"}][i], estimated_gpu_hours=Decimal("1.25"), estimated_cost=None,
                idempotency_key=f"{prefix}-{i}")
            for i in range(2)
        ]  # fmt: skip

    fields = ["name", "gpus", "state", "environment", "estimated_gpu_hours", "estimated_cost", "partition"]
    copied, created = rows("copy"), rows("orm")
    bulk_upsert_copy(copied, unique_fields=["id"], update_fields=["name"])
    Job.objects.bulk_create(created)
    got = [Job.objects.filter(pk=job.pk).values(*fields).get() for job in copied]
    want = [Job.objects.filter(pk=job.pk).values(*fields).get() for job in created]
    assert [{**row, "name": row["name"][4:]} for row in got] == [{**row, "name": row["name"][3:]} for row in want]
    assert got[0]["environment"] == "just a string" and got[0]["gpus"] == 2 and got[0]["state"] == "PENDING"


def test_copy_insert_writes_dates_datetimes_decimals_and_keys_as_bulk_create_does(world, settings):
    """The COPY rows pass a date, an aware datetime, a finite Decimal, a foreign key's id and a UUID as
    they are; a naive datetime (Django makes it aware in the current time zone, with a warning), a
    datetime in a DateField (Django keeps its date), a Decimal with more places than the column
    and a string for a Decimal take Django's own conversion: the rows read back are bulk_create's. The
    site's time zone is not the connection's (UTC), so a naive datetime passed as it is would land 8 h off."""
    import warnings
    from zoneinfo import ZoneInfo

    from accounting.models import UsageRecord, UsageSlice

    settings.TIME_ZONE = "Asia/Shanghai"
    start = dt.datetime(2026, 3, 31, 22, 30, tzinfo=ZoneInfo("Asia/Shanghai"))
    record = UsageRecord.objects.create(
        cluster="c", job_id=7, submit_time=start, start_time=start, state="COMPLETED", account="vision",
        team=world.vision, unix_user="alice", gpus=1, gpu_seconds=60, elapsed_seconds=60, known_until=start,
        first_seen_at=start,
    )  # fmt: skip

    def slices(offset):
        return [
            UsageSlice(record=record, period=dt.date(2026, 3, 1), slice_start=start + dt.timedelta(hours=offset),
                       slice_end=start + dt.timedelta(hours=offset, minutes=1), cluster="c", account="vision",
                       team_id=world.vision.pk, unix_user="alice", gpus=1, gpu_seconds=60, requested_gpu_seconds=60,
                       price_per_gpu_hour=Decimal("8.0000"), cost=Decimal("0.133333")),
            UsageSlice(record=record, period=dt.datetime(2026, 4, 1, 12, 0), slice_start=dt.datetime(2026, 4, 1, 1 + offset),
                       slice_end=dt.datetime(2026, 4, 1, 2 + offset), cluster="c", account="vision", team=None,
                       unix_user="alice", gpus=2, gpu_seconds=7200, requested_gpu_seconds=7200,
                       price_per_gpu_hour="7.5", cost=Decimal("1.23456789")),
        ]  # fmt: skip

    fields = ["period", "slice_start", "slice_end", "team_id", "record_id", "price_per_gpu_hour", "cost", "gpus"]
    copied, created = slices(0), slices(10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # Django's naive-datetime warning, both ways
        assert bulk_insert_copy(copied) == 2
        UsageSlice.objects.bulk_create(created)
    got = list(UsageSlice.objects.filter(slice_start__in=[s.slice_start for s in copied]).order_by("gpus").values(*fields))
    want = list(UsageSlice.objects.filter(slice_start__in=[s.slice_start for s in created]).order_by("gpus").values(*fields))
    shift = dt.timedelta(hours=10)
    assert [{**row, "slice_start": row["slice_start"] + shift, "slice_end": row["slice_end"] + shift} for row in got] == want
    assert got[0]["slice_start"] == start and got[1]["period"] == dt.date(2026, 4, 1)
    assert got[1]["cost"] == Decimal("1.234568") and got[0]["team_id"] == world.vision.pk
    assert got[1]["slice_start"] == dt.datetime(2026, 3, 31, 17, tzinfo=dt.UTC)  # 01:00 in Shanghai


def test_row_maker_holds_what_the_keyword_constructor_holds_and_the_copy_writers_write_it(world):
    """portal.db.row_maker: every concrete field's value as ``Model(**values)`` sets it — the given
    ones, the defaults of the others (a callable one called per row, not shared) —, no model
    instance; a name that is not an attname is a TypeError, not a field silently left out. The COPY
    writers take such rows: bulk_upsert_copy gives each its id, and what they write reads back as
    the model instance would have been written."""
    from accounting.models import UsageRecord

    now = timezone.now()
    given = {"cluster": "c", "job_id": 9, "submit_time": now, "start_time": now, "state": "RUNNING", "account": "vision",
             "team_id": world.vision.pk, "unix_user": "alice", "known_until": now, "first_seen_at": now}  # fmt: skip
    made, built = portal_db.row_maker(UsageRecord)(**given), UsageRecord(**given)
    names = [field.attname for field in UsageRecord._meta.concrete_fields]
    assert [getattr(made, name) for name in names] == [getattr(built, name) for name in names]
    assert made.gpu_hours == Decimal("0") and made.comment == "" and made.end_time is None and made.pk is None
    assert not isinstance(made, UsageRecord)

    job_row = portal_db.row_maker(Job)  # Job.id defaults to uuid4: one per row
    first, second = job_row(name="a"), job_row(name="b")
    assert isinstance(first.id, uuid.UUID) and first.id != second.id and first.name == "a" and first.pk == first.id
    assert job_row(id=first.id).id == first.id
    with pytest.raises(TypeError, match="team"):
        portal_db.row_maker(UsageRecord)(team=world.vision)  # the attname is team_id

    bulk_upsert_copy([made], unique_fields=["cluster", "job_id", "submit_time"], update_fields=["state"])
    stored = UsageRecord.objects.get(pk=made.pk)
    assert made.pk is not None and made.id == made.pk
    assert [getattr(stored, name) for name in names if name != "id"] == [getattr(built, name) for name in names if name != "id"]
    other = portal_db.row_maker(UsageRecord)(**{**given, "job_id": 10, "gpus": 2, "gpu_seconds": 7200})
    assert bulk_insert_copy([other]) == 1
    assert UsageRecord.objects.filter(job_id=10, gpus=2, gpu_seconds=7200, team=world.vision).count() == 1


def test_any_of_binds_one_array_parameter_and_filters_like_a_list(world):
    jobs = _jobs(world, 3)
    wanted = {jobs[0].pk, jobs[2].pk, uuid.uuid4()}
    with CaptureQueriesContext(connection) as queries:
        found = set(Job.objects.filter(pk__in=any_of(wanted, "uuid")).values_list("pk", flat=True))
    assert found == {jobs[0].pk, jobs[2].pk}
    assert "unnest" in queries.captured_queries[0]["sql"]
    with pytest.raises(ValueError, match="plain SQL type"):
        any_of([1], "bigint[]); DROP TABLE x; --")


def test_any_of_checks_each_integer_and_uuid_it_writes_into_the_array_literal(world):
    """Integers and UUIDs go as one array literal: each value is checked as binding it would be (an
    integer, not 1.5 or "1"; a UUID or its text), so nothing else can reach the literal."""
    jobs = _jobs(world, 2)
    found = Job.objects.filter(pk__in=any_of([str(jobs[0].pk), jobs[1].pk], "uuid")).values_list("pk", flat=True)
    assert set(found) == {jobs[0].pk, jobs[1].pk}
    assert list(Job.objects.filter(pk__in=any_of([], "uuid"))) == []
    for bad in (1.5, "1", "1}, {2"):
        with pytest.raises(TypeError):
            any_of([bad], "bigint")
    with pytest.raises(ValueError):
        any_of(["not-a-uuid"], "uuid")


def test_copy_upsert_gives_each_of_many_rows_its_own_id_new_and_existing_mixed(world):
    """Ids come back by each object's index (the INSERT's rows joined to the temporary table's on the key):
    rows in no particular order, some existing, get the ids the table has for their keys."""
    from accounting.models import UsageRecord

    made = portal_db.row_maker(UsageRecord)
    at = timezone.now().replace(microsecond=0)

    def row(job_id):
        return made(cluster="c1", job_id=job_id, submit_time=at - dt.timedelta(seconds=job_id), start_time=at, state="RUNNING",
                    account="vision", unix_user="alice", gpus=1, gpu_type="a100", gpu_seconds=job_id, gpu_hours=0,
                    requested_gpu_hours=0, provisional=True, known_until=at, first_seen_at=at)  # fmt: skip

    first = [row(j) for j in range(0, 40, 2)]
    bulk_upsert_copy(first, unique_fields=["cluster", "job_id", "submit_time"], update_fields=["state"])
    mixed = [row(j) for j in reversed(range(40))]
    bulk_upsert_copy(mixed, unique_fields=["cluster", "job_id", "submit_time"], update_fields=["state"])
    stored = dict(UsageRecord.objects.filter(cluster="c1").values_list("job_id", "pk"))
    assert len(stored) == 40
    assert {r.job_id: r.pk for r in mixed} == stored
    assert {r.job_id: r.pk for r in first} == {j: stored[j] for j in range(0, 40, 2)}


# ---------------------------------------------------------------- the connection's health check


@pytest.mark.django_db(transaction=True)
def test_a_connection_the_server_ended_while_idle_is_replaced_at_the_next_request():
    """CONN_HEALTH_CHECKS (portal.env): a persistent connection that PostgreSQL ended between two
    requests (a restart, pg_terminate_backend, idle_session_timeout) is not an error for the next
    request — Django's check at its start closes it and the first query opens another."""
    import psycopg
    from django.db import close_old_connections

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (first_pid,) = cursor.fetchone()
    assert connection.health_check_enabled

    db = connection.settings_dict
    with psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"], password=db["PASSWORD"] or None,
                         dbname=db["NAME"], autocommit=True) as other:  # fmt: skip
        other.execute("SELECT pg_terminate_backend(%s)", [first_pid])

    close_old_connections()  # what Django does when a request starts (and ends)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (second_pid,) = cursor.fetchone()
    assert second_pid != first_pid
