"""The outbox (portal/outbox.py): with the broker unreachable every write still answers success and
its row is committed; once the broker is back, the work's sweeper enqueues it. The broker is a
closed port for this process only (the shared Redis keeps running); "back" is this run's own
Redis database and a queue of this test's own, read directly."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket

import pytest
import redis
from django.utils import timezone

from accounting.models import BudgetAlert, Quota, Rate
from accounting.services import budget_alert_sweep
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import jobs_sweep
from portal.models import Membership
from portal.services import membership_set, team_mirror_sweep
from portal.tasks import team_mirror_sweep_task
from tests.conftest import _use_broker
from tests.fakes import FakeGateway
from tests.support import job_payload

pytestmark = pytest.mark.django_db


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once the socket is closed


@pytest.fixture
def broker(settings):
    """Eager mode off and the broker down; ``broker.back()`` points it at a real Redis database,
    ``broker.sent()`` lists the (task, args) on this test's queue there."""
    from portal.celery import app

    saved = app.conf.task_always_eager, app.conf.broker_url, app.conf.task_default_queue
    queue = f"outbox-test-{os.getpid()}"
    back_url = saved[1] if saved[1].startswith("redis://") else "redis://127.0.0.1:6379/4"
    settings.CELERY_TASK_ALWAYS_EAGER = False
    app.conf.task_always_eager = False
    app.conf.task_default_queue = queue
    _use_broker(f"redis://127.0.0.1:{_closed_port()}/0")
    store = redis.Redis.from_url(back_url)
    store.delete(queue)

    class Broker:
        @staticmethod
        def back():
            _use_broker(back_url)

        @staticmethod
        def sent() -> list[tuple[str, str]]:
            messages = [json.loads(raw) for raw in store.lrange(queue, 0, -1)]
            return [(m["headers"]["task"], m["headers"]["argsrepr"]) for m in messages]

    yield Broker
    store.delete(queue)
    app.conf.task_always_eager, _, app.conf.task_default_queue = saved
    _use_broker(saved[1])


def test_job_submit_answers_201_and_the_sweeper_relays_it_later(
    api_client_for, world, inventory_small, broker, django_capture_on_commit_callbacks, settings, caplog
):
    with django_capture_on_commit_callbacks(execute=True):
        response = api_client_for("member").post("/api/v1/jobs/", job_payload(), format="json")
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert job.state == JobState.ACCEPTED
    assert "jobs.tasks.job_relay_drain() not enqueued" in caplog.text
    assert broker.sent() == []

    broker.back()
    Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - dt.timedelta(seconds=settings.JOB_ACCEPTED_SWEEP_SECONDS + 1))
    assert jobs_sweep() == {"relays": 1, "cancels": 0}
    assert broker.sent() == [("jobs.tasks.job_relay_drain", "()")]  # one drain relays every stale job
    # the failed publish left no coalescing flag up: the next submit publishes its own drain
    with django_capture_on_commit_callbacks(execute=True):
        assert api_client_for("member").post("/api/v1/jobs/", job_payload(), format="json").status_code == 201
    assert broker.sent() == [("jobs.tasks.job_relay_drain", "()")] * 2


def test_job_cancel_answers_success_and_the_sweeper_sends_it_later(
    api_client_for, world, inventory_small, broker, django_capture_on_commit_callbacks, settings
):
    broker.back()
    with django_capture_on_commit_callbacks(execute=True):
        job_id = api_client_for("member").post("/api/v1/jobs/", job_payload(), format="json").json()["id"]
    Job.objects.filter(pk=job_id).update(state=JobState.PENDING, slurm_job_id=4242)
    _use_broker(f"redis://127.0.0.1:{_closed_port()}/0")
    with django_capture_on_commit_callbacks(execute=True):
        response = api_client_for("member").post(f"/api/v1/jobs/{job_id}/cancel/")
    assert response.status_code in (200, 202), response.content
    job = Job.objects.get(pk=job_id)
    assert job.cancel_requested_at is not None

    broker.back()
    Job.objects.filter(pk=job_id).update(cancel_requested_at=timezone.now() - dt.timedelta(seconds=settings.JOB_ACCEPTED_SWEEP_SECONDS + 1))
    assert jobs_sweep()["cancels"] == 1
    assert ("jobs.tasks.job_cancel_relay", repr((str(job_id),))) in broker.sent()


def test_rate_create_answers_a_redirect_and_keeps_the_rate(client_for, world, broker, django_capture_on_commit_callbacks, caplog):
    """Re-pricing used to raise into the request here (the rate was committed, the admin saw a 500)."""
    with django_capture_on_commit_callbacks(execute=True):
        response = client_for("admin").post(
            "/accounting/rates/", {"gpu_type": "a100", "price_per_gpu_hour": "9", "effective_from": "2026-01-20"}
        )
    assert response.status_code == 302
    assert Rate.objects.filter(gpu_type="a100", effective_from=dt.date(2026, 1, 20)).exists()
    assert "accounting.tasks.usage_reprice_task" in caplog.text


def test_membership_change_is_kept_when_the_team_mirror_cannot_be_enqueued(world, broker, django_capture_on_commit_callbacks, caplog):
    with django_capture_on_commit_callbacks(execute=True):
        membership_set(team=world.vision, user=world.outsider, actor=world.admin)
    assert Membership.objects.filter(team=world.vision, user=world.outsider).exists()
    assert "portal.tasks.team_mirror_to_slurm" in caplog.text


def test_budget_alert_sweeper_enqueues_alerts_not_emailed(world, broker):
    quota = Quota.objects.filter(team=world.vision).first()
    alert = BudgetAlert.objects.create(quota=quota, threshold=80, consumed_gpu_hours=800, budget_gpu_hours=1000)
    sent = BudgetAlert.objects.create(quota=quota, threshold=100, consumed_gpu_hours=1000, budget_gpu_hours=1000,
                                      emailed_at=timezone.now())  # fmt: skip
    assert budget_alert_sweep() == []  # too recent: its own enqueue may still be under way
    broker.back()
    later = timezone.now() + dt.timedelta(minutes=6)
    assert budget_alert_sweep(now=later) == [alert.pk]
    assert broker.sent() == [("accounting.tasks.budget_alert_deliver_task", repr((alert.pk,)))]
    assert sent.pk not in budget_alert_sweep(now=later)


def test_team_mirror_sweep_makes_slurm_match_every_team_once(world, use_gateway):
    """A mirror the broker lost leaves Slurm without the team's account and users: the sweep adds them."""
    gateway = use_gateway(FakeGateway())
    done = team_mirror_sweep_task()
    assert gateway.calls["associations"] == 1  # one read of Slurm for all teams
    rows = {(a.account, a.user) for a in gateway.associations()}
    assert {("vision", ""), ("vision", "alice"), ("vision", "bob"), ("nlp", ""), ("nlp", "carol"), ("nlp", "dave")} <= rows
    assert "account vision is missing in Slurm" in done
    assert team_mirror_sweep() == []  # in sync: nothing to do
