"""The relay's lease renewal on the hot path (jobs.services.relay._Lease): a relay round that ends
within RELAY_LEASE_RENEW_SECONDS — every round of a few sbatch calls — runs no query more than before
renewals existed; a round that lasts longer renews once per period (one UPDATE of its claims), so its
jobs stay its own past the lease. The fault tests kill a real worker: tests/faults/test_relay_lease.py."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_relay_drain_run, job_submit, relay
from tests.fakes import FakeGateway

pytestmark = pytest.mark.django_db


@pytest.fixture
def fake(use_gateway):
    return use_gateway(FakeGateway.like_local_cluster())


def _submit(world, n: int) -> list[Job]:
    return [job_submit(user=world.alice, team=world.vision, name=f"l-{i}", script="#!/bin/bash\ntrue\n", partition="debug",
                       gpus=1, time_limit_minutes=2)[0] for i in range(n)]  # fmt: skip


@pytest.mark.parametrize("n", [1, 100])
def test_a_quick_relay_round_renews_nothing_and_costs_the_same_queries(world, inventory, fake, n):
    _submit(world, n)
    with CaptureQueriesContext(connection) as captured:
        result = job_relay_drain_run(limit=100)
    assert (result["submitted"], result["lease_renewals"]) == (n, 0)
    renewals = [q for q in captured.captured_queries if q["sql"].startswith('UPDATE "jobs_job" SET "relay_started_at"')]
    assert renewals == []
    print(f"\n[relay] drain of {n}: {len(captured.captured_queries)} queries")


def test_a_relay_round_longer_than_the_renewal_period_renews_its_lease(world, inventory, fake, monkeypatch):
    monkeypatch.setattr(relay, "RELAY_LEASE_RENEW_SECONDS", 0.2)
    submit = fake.submit

    def slow_submit(submission):
        time.sleep(0.25)
        return submit(submission)

    monkeypatch.setattr(fake, "submit", slow_submit)
    jobs = _submit(world, 16)  # 16 x 0.25 s / 4 threads: 1 s at the least, two renewals or more (0.45 s gave one)
    seen = []
    renew = relay._Lease.renew_if_due

    def watched(lease):
        renew(lease)
        seen.extend(Job.objects.filter(relay_token=lease.token).values_list("relay_started_at", flat=True))

    monkeypatch.setattr(relay._Lease, "renew_if_due", watched)
    before = timezone.now()
    result = job_relay_drain_run(limit=100)
    assert result["submitted"] == 16 and result["lease_renewals"] >= 2
    assert max(seen) > before + dt.timedelta(seconds=0.2)  # the claims' lease moved on while the round worked
    assert set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("state", flat=True)) == {JobState.PENDING}


def test_a_relay_that_cannot_renew_starts_no_sbatch_past_its_lease(world, inventory, fake, monkeypatch, settings):
    from django.db import OperationalError

    settings.SLURM_TIMEOUT = 1
    monkeypatch.setattr(relay, "RELAY_LEASE_SECONDS", 4)  # sbatch may start for 4 - 1 - 2 = 1 s after the claim
    monkeypatch.setattr(relay, "RELAY_LEASE_RENEW_SECONDS", 0.1)
    monkeypatch.setattr(relay, "relay_lease_seconds", lambda: 4)
    submit = fake.submit
    monkeypatch.setattr(fake, "submit", lambda submission: (time.sleep(0.3), submit(submission))[1])
    real_update = relay.Job.objects.filter

    def failing_renewal(*args, **kwargs):  # the database failing over: every renewal fails
        if "relay_token" in kwargs and "state" in kwargs and kwargs.get("slurm_job_id__isnull"):
            raise OperationalError("the database is failing over")
        return real_update(*args, **kwargs)

    monkeypatch.setattr(relay.Job.objects, "filter", failing_renewal)
    _submit(world, 12)  # 12 x 0.3 s one at a time: 3.6 s, beyond the 1 s window
    with pytest.raises(relay.SlurmUnavailable, match="time budget"):
        relay.job_relay_batch_run(list(Job.objects.values_list("pk", flat=True)), threads=1)
    assert 1 <= fake.calls["submit"] < 12  # what started within the window, nothing after
