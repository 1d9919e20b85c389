"""Issue 16: what one single-job POST /api/v1/jobs/ costs in queries, token-authenticated, once the
per-change reads (inventory, rate book: portal/snapshots.py; the token lookup) are warm — and that a
batch costs as many as one job (the count does not grow with the jobs)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from accounting.services import rate_create
from jobs.models import Job, JobEvent
from portal.models import AuditEvent
from portal.services import api_token_create
from tests.support import job_payload

# transactional: the service's transaction is the outermost one, as in production (inside a test's
# transaction it would be a savepoint: 2 more statements that production never sends)
pytestmark = pytest.mark.django_db(transaction=True)

# Queries of one single-job POST, warm, as django_assert_num_queries counts them (BEGIN and COMMIT
# included: they are round trips too):
#   1  BEGIN
#   1  the job, its ACCEPTED event and its audit event: one statement (portal.db.rows_insert, each
#      table's rows one JSON parameter; issue 38, nineteenth session: 2 fewer than the three ORM
#      INSERTs of issue 29, and the same text for every job, so PostgreSQL runs it prepared)
#   1  the budget check (accounting.services.budget.budget_holds_place): one statement locks the
#      team row, inserts the hold, adds it to the team's running totals under their row locks and
#      returns the team's budget version as the lock read it — no aggregate over live jobs or usage.
#      The team's quotas in force and the bookings' booked hours then come from this process's
#      copies, read at that version (issue 38; issue 29 read them from the database under the lock,
#      2 queries, so that a quota or booking approved while the submission waited for the lock
#      decides it — it still does: the approval moved the version, tests/accounting/test_quotas_race.py)
#   1  COMMIT
# The token lookup (with the submitter's profile, whose Unix account names the default working
# directory: issue 38, one query fewer), the inventory, the prices and the team with the submitter's
# role cost none while this process's copies are current (portal/snapshots.py; before issue 16: 19
# statements, bench/post_profile_before.md; session 5: 7; issue 29: 9).
SINGLE_JOB_POST_QUERIES = 4  # 2 besides BEGIN/COMMIT (issue 16's bound: 6)


@pytest.fixture(autouse=True)
def private_cache(settings):
    """A cache of this test's own: the shared Redis cache database is flushed by every other test
    run's _clear_cache on this machine, which would drop the warm copies between two requests."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "i16"}}


@pytest.fixture
def token_client(world):
    _, key = api_token_create(user=world.alice, name="bench")
    return APIClient(HTTP_AUTHORIZATION=f"Token {key}")


@pytest.fixture
def priced(world):
    day = timezone.localdate() - dt.timedelta(days=1)
    for gpu_type, price in (("a100", "8"), ("h100", "16")):
        rate_create(gpu_type=gpu_type, price_per_gpu_hour=Decimal(price), effective_from=day)


def test_one_job_post_costs_a_fixed_number_of_queries(token_client, inventory, priced, relays, django_assert_num_queries):
    for _ in range(2):  # warm: the first builds the team's running totals, the second reads the copies
        assert token_client.post("/api/v1/jobs/", job_payload(), format="json").status_code == 201
    with django_assert_num_queries(SINGLE_JOB_POST_QUERIES) as captured:
        response = token_client.post("/api/v1/jobs/", job_payload(name="counted"), format="json")
    assert response.status_code == 201
    # the breakdown above, in order
    statements = [" ".join(query["sql"].split())[:60] for query in captured.captured_queries]
    assert statements[0] == "BEGIN" and statements[-1] == "COMMIT", statements
    assert statements[1].startswith('WITH i0 AS (INSERT INTO "jobs_job"'), statements
    assert statements[2].startswith("WITH team AS (SELECT id, budget_version FROM portal_team"), statements
    job = Job.objects.get(pk=response.json()["id"])
    # nothing traded: the job priced, its event and its audit event written with it
    assert job.estimated_cost is not None and job.currency
    assert list(JobEvent.objects.filter(job=job).values_list("state", flat=True)) == ["ACCEPTED"]
    assert AuditEvent.objects.filter(action="job.submit", target_id=str(job.pk)).count() == 1


def test_any_gpu_type_costs_no_more_queries(token_client, inventory, priced, relays, django_assert_num_queries):
    """Any type: every type of the partition is priced (the dearest wins) from the same rate book."""
    body = job_payload(gpu_type="")
    for _ in range(2):  # warm, as above
        assert token_client.post("/api/v1/jobs/", body, format="json").status_code == 201
    with django_assert_num_queries(SINGLE_JOB_POST_QUERIES):
        response = token_client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201 and response.json()["estimated_cost"] is not None


def test_a_batch_costs_as_many_queries_for_ten_jobs_as_for_two(token_client, inventory, priced, relays, django_assert_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(2):  # warm, as above
        assert token_client.post("/api/v1/jobs/", [job_payload()] * 2, format="json").status_code == 201
    with CaptureQueriesContext(connection) as two:
        assert token_client.post("/api/v1/jobs/", [job_payload(name="two")] * 2, format="json").status_code == 201
    with django_assert_num_queries(len(two)):
        response = token_client.post("/api/v1/jobs/", [job_payload(name="ten")] * 10, format="json")
    assert response.status_code == 201 and len(response.json()) == 10
    assert JobEvent.objects.filter(job__name="ten").count() == 10


def test_a_new_price_applies_to_the_next_post(token_client, inventory, priced, relays):
    first = token_client.post("/api/v1/jobs/", job_payload(), format="json").json()
    rate_create(gpu_type="a100", price_per_gpu_hour=Decimal("80"), effective_from=timezone.localdate())
    second = token_client.post("/api/v1/jobs/", job_payload(), format="json").json()
    assert Decimal(second["estimated_cost"]) == 10 * Decimal(first["estimated_cost"])
