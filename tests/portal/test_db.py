"""portal.db: bulk_update_values (one UPDATE … FROM (VALUES …) per batch writes what bulk_update
would — every field type the jobs use, NULLs, JSON — only on rows the queryset selects, in a number
of queries that does not grow with the rows), COPY inserts and upserts that write what bulk_create
would, and any_of (one array parameter for an IN list)."""

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
from portal.db import any_of, bulk_insert_copy, bulk_update_values, bulk_upsert_copy

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


def test_writes_each_rows_own_values_of_every_field_type(world):
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
    written = bulk_update_values(Job.objects.all(), jobs, fields)
    assert written == 3
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


def test_only_rows_the_queryset_selects_are_written(world):
    live, ended = _jobs(world, 1), _jobs(world, 1, state=JobState.COMPLETED)
    for job in live + ended:
        job.state_reason = "changed"
    written = bulk_update_values(Job.objects.filter(state=JobState.ACCEPTED), live + ended, ["state_reason"])
    assert written == 1
    assert Job.objects.get(pk=live[0].pk).state_reason == "changed"
    assert Job.objects.get(pk=ended[0].pk).state_reason == ""


def test_one_statement_per_batch_whatever_the_rows(world):
    jobs = _jobs(world, 25)
    for job in jobs:
        job.state_reason = f"r-{job.pk}"
    with CaptureQueriesContext(connection) as queries:
        written = bulk_update_values(Job.objects.all(), jobs, ["state_reason"], batch_size=10)
    assert written == 25
    assert len(queries) == 3  # 10 + 10 + 5
    assert all(sql["sql"].startswith('UPDATE "jobs_job"') for sql in queries.captured_queries)
    assert {j.state_reason for j in Job.objects.all()} == {f"r-{job.pk}" for job in jobs}


def test_no_rows_no_query_and_a_key_or_unknown_field_is_refused(world):
    with CaptureQueriesContext(connection) as queries:
        assert bulk_update_values(Job.objects.all(), [], ["state"]) == 0
    assert len(queries) == 0
    jobs = _jobs(world, 1)
    with pytest.raises(ValueError, match="'id' is not a concrete, non-key field"):
        bulk_update_values(Job.objects.all(), jobs, ["id"])
    with pytest.raises(Exception, match="no field named 'nope'"):
        bulk_update_values(Job.objects.all(), jobs, ["nope"])


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


def test_any_of_binds_one_array_parameter_and_filters_like_a_list(world):
    jobs = _jobs(world, 3)
    wanted = {jobs[0].pk, jobs[2].pk, uuid.uuid4()}
    with CaptureQueriesContext(connection) as queries:
        found = set(Job.objects.filter(pk__in=any_of(wanted, "uuid")).values_list("pk", flat=True))
    assert found == {jobs[0].pk, jobs[2].pk}
    assert "unnest" in queries.captured_queries[0]["sql"]
    with pytest.raises(ValueError, match="plain SQL type"):
        any_of([1], "bigint[]); DROP TABLE x; --")


# ---------------------------------------------------------------- insert_together


def _new_job(world, **values):
    return Job(team=world.vision, submitter=world.alice, name="t", script="#!/bin/bash\ntrue\n", partition="gpu",
               gpus=1, time_limit_minutes=5, workdir="/tmp", state=JobState.ACCEPTED, estimated_gpu_hours=1,
               environment={"A": "1"}, **values)  # fmt: skip


def test_insert_together_writes_rows_of_several_models_in_one_statement(world, django_assert_num_queries):
    from jobs.models import JobEvent
    from portal.db import insert_together
    from portal.models import AuditEvent

    job = _new_job(world, idempotency_key="k1")
    event = lambda: JobEvent(job=job, state=JobState.ACCEPTED, reason="Accepted by the portal", at=job.created_at)  # noqa: E731
    audit = AuditEvent(actor=world.alice, actor_name="alice", action="job.submit", target_type="jobs.job",
                       target_id=str(job.pk), team=world.vision, data={"gpus": 1})  # fmt: skip
    with django_assert_num_queries(1):
        _, event, _ = insert_together(job, event, audit)
    assert job.created_at is not None and not job._state.adding  # auto_now_add set, as save() does
    stored = Job.objects.get(pk=job.pk)
    assert (stored.environment, stored.created_at, stored.idempotency_key) == ({"A": "1"}, job.created_at, "k1")
    assert list(JobEvent.objects.filter(job=job).values_list("reason", "at")) == [("Accepted by the portal", job.created_at)]
    assert AuditEvent.objects.get(target_id=str(job.pk)).data == {"gpus": 1}


def test_insert_together_is_all_or_nothing_on_a_unique_violation(world):
    from django.db import IntegrityError, transaction

    from jobs.models import JobEvent
    from portal.db import insert_together

    Job.objects.create(**{f.name: getattr(_new_job(world, idempotency_key="dup"), f.name)
                          for f in Job._meta.concrete_fields if f.name not in ("id", "created_at")})  # fmt: skip
    job = _new_job(world, idempotency_key="dup")
    with pytest.raises(IntegrityError), transaction.atomic():
        insert_together(job, JobEvent(job=job, state=JobState.ACCEPTED, reason="x", at=timezone.now()))
    assert not Job.objects.filter(pk=job.pk).exists() and not JobEvent.objects.filter(job_id=job.pk).exists()


def test_insert_together_second_time_takes_the_kept_text_with_the_new_values(world):
    """The INSERT's text is compiled once per model and fields; the values are each call's own, and
    a value that is an expression (here Now()) is compiled, not bound as a parameter."""
    from django.db.models.functions import Now

    from portal import db

    first, second = _new_job(world, idempotency_key="first"), _new_job(world, idempotency_key="second")
    second.gpus = 3
    db.insert_together(first)
    key = next(k for k in db._INSERT_TEXT if k[0] is Job)
    db.insert_together(second)
    assert list(Job.objects.filter(pk__in=[first.pk, second.pk]).order_by("idempotency_key")
                .values_list("idempotency_key", "gpus")) == [("first", 1), ("second", 3)]  # fmt: skip
    third = _new_job(world, started_at=Now())
    db.insert_together(third)
    assert Job.objects.get(pk=third.pk).started_at is not None
    text, plan = db._INSERT_TEXT[key]
    assert text.count("%s") == len(key[1]) == len(plan)  # the kept text has a placeholder per field
    created = next(p for p in plan if p[0].name == "created_at")
    assert created[1] is False  # auto_now_add: its own pre_save, which the kept path still calls
    assert second.created_at is not None and Job.objects.get(pk=second.pk).created_at == second.created_at  # set by it


@pytest.mark.django_db
def test_a_statement_with_many_parameters_is_converted_once_not_per_execution():
    """psycopg_statement_cache_widen (PortalConfig.ready): a long INSERT of a submission (here 120
    parameters, psycopg's own limit is 50) comes out of psycopg's conversion cache the second time."""
    from django.db import connection
    from psycopg import _queries

    sql = "SELECT " + ", ".join(["%s::int"] * 120)
    with connection.cursor() as cursor:
        cursor.execute(sql, list(range(120)))
        hits = _queries._query2pg_client.cache_info().hits
        cursor.execute(sql, list(range(1, 121)))
        assert cursor.fetchone()[-1] == 120
    assert _queries._query2pg_client.cache_info().hits == hits + 1


# ---------------------------------------------------------------- prepared_cursor


def _prepared(sql_start: str) -> list[tuple[int, int]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
                       [sql_start + "%"])  # fmt: skip
        return cursor.fetchall()


@pytest.mark.django_db
def test_a_prepared_cursor_statement_is_prepared_once_and_then_executed_by_name(django_assert_num_queries):
    from portal.db import prepared_cursor

    sql = "SELECT %s::int + 40 AS prepared_cursor_probe"
    with django_assert_num_queries(3):  # counted as Django's own cursors' statements are
        for value in (1, 2, 3):
            with prepared_cursor() as cursor:
                cursor.execute(sql, [value])
                assert cursor.fetchone() == (40 + value,)  # each execution's own parameter
    [(generic, custom)] = _prepared("SELECT $1::int + 40")
    assert generic + custom == 3  # one statement, three executions of it


@pytest.mark.django_db
def test_without_prepared_statements_the_cursor_is_djangos_own(settings):
    from portal.db import prepared_cursor

    settings.DATABASE_PREPARED_STATEMENTS = False
    with prepared_cursor() as cursor:
        cursor.execute("SELECT %s::int + 50 AS prepared_cursor_probe_off", [1])
        assert cursor.fetchone() == (51,)
    assert _prepared("SELECT $1::int + 50") == [] and _prepared("SELECT 1::int + 50") == []


@pytest.mark.django_db
def test_a_prepared_statement_error_is_djangos_exception_and_the_transaction_stays_usable():
    from django.db import IntegrityError, transaction

    from portal.db import prepared_cursor

    for _ in range(2):  # the second time by the prepared statement's name
        with pytest.raises(IntegrityError, match="null value"), transaction.atomic():
            with prepared_cursor() as cursor:
                cursor.execute("INSERT INTO portal_team (id) VALUES (%s)", [None])
    with prepared_cursor() as cursor:  # the connection and the statement cache survive the rollbacks
        cursor.execute("SELECT %s::text || 'k'", ["o"])
        assert cursor.fetchone() == ("ok",)


# ---------------------------------------------------------------- the health check (portal.dbbackend)


def _new_request(wrapper) -> None:
    """What Django does when a request starts: a persistent connection is checked again."""
    wrapper.close_if_unusable_or_obsolete()
    assert wrapper.health_check_done is False


@pytest.mark.django_db(transaction=True)
def test_a_quiet_connection_is_reused_without_a_select_1_and_an_ended_one_is_replaced(monkeypatch):
    import select

    import psycopg
    from django.db import connection

    from portal.dbbackend.base import DatabaseWrapper

    checks = []
    real = DatabaseWrapper.is_usable
    monkeypatch.setattr(DatabaseWrapper, "is_usable", lambda self: checks.append(1) or real(self))
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (first_pid,) = cursor.fetchone()
    assert connection.health_check_enabled  # CONN_HEALTH_CHECKS, as portal.env sets it

    _new_request(connection)
    with connection.cursor() as cursor:  # quiet: no SELECT 1, the same server process
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone() == (first_pid,) and checks == []

    # the server ends it while it is idle (a restart does the same to every connection)
    db = connection.settings_dict
    with psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"], autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [first_pid])
    poller = select.poll()
    poller.register(connection.connection.fileno(), select.POLLIN)
    assert poller.poll(5000), "the server's goodbye did not arrive within 5 s"

    _new_request(connection)
    with connection.cursor() as cursor:  # not an error: Django's SELECT 1 failed, a new connection
        cursor.execute("SELECT pg_backend_pid()")
        (second_pid,) = cursor.fetchone()
    assert checks == [1] and second_pid != first_pid
