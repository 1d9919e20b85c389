"""The outbox (portal/outbox.py): with the broker unreachable every write still answers success and
its row is committed; once the broker is back, the work's sweeper enqueues it. The broker is a
closed port for this process only (the shared Redis keeps running); "back" is this run's own
Redis database and a queue of this test's own, read directly."""

from __future__ import annotations

import ast
import contextlib
import datetime as dt
import io
import json
import os
import socket
import urllib.error
import urllib.request
from decimal import Decimal
from pathlib import Path

import pytest
import redis
from django.core import mail
from django.utils import timezone

from accounting.models import Booking, BookingStatus, BudgetAlert, PendingReprice, Quota, Rate, ReservationState, UsageSlice
from accounting.services import (
    booking_cleanup,
    booking_reserve_run,
    budget_alert_sweep,
    budget_alert_webhook,
    budget_alert_webhook_sweep,
    rate_create,
    repricing,
    usage_records_upsert,
    usage_reprice_owed,
    usage_reprice_pending,
    usage_reprice_sweep,
)
from accounting.services.alerts import WEBHOOK_ATTEMPTS, WEBHOOK_LEASE
from accounting.tasks import budget_alert_deliver_task, budget_alert_webhook_task, usage_reprice_task
from jobs.choices import JobState
from jobs.models import Job, JobArrayTask
from jobs.services import (
    _apply_plan,
    job_cancel_relay_run,
    job_end_notify_send,
    job_end_notify_sweep,
    job_relay_batch_run,
    job_relay_run,
    jobs_sweep,
)
from portal.models import Membership, Profile
from portal.services import membership_set, team_mirror_sweep
from portal.tasks import team_mirror_sweep_task
from tests.accounting.helpers import acct, at
from tests.accounting.test_bookings import day_at, make_inventory
from tests.conftest import _use_broker
from tests.workers import _broker_database
from tests.fakes import FakeGateway
from tests.security.test_url_matrix import make_job
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
    from portal.project.celery import app

    saved = app.conf.task_always_eager, app.conf.broker_url, app.conf.task_default_queue
    queue = f"outbox-test-{os.getpid()}"
    back_url = saved[1] if saved[1].startswith("redis://") else _broker_database(4)
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
    assert jobs_sweep() == {"relays": 1, "cancels": 0, "task_cancels": 0}
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


def test_one_array_task_cancel_answers_202_is_kept_on_its_row_and_the_sweeper_sends_it_later(
    api_client_for, world, inventory_small, broker, django_capture_on_commit_callbacks, settings
):
    """The web process does not talk to the scheduler for one task's cancel either: a row, then a task."""
    broker.back()
    with django_capture_on_commit_callbacks(execute=True):
        job_id = api_client_for("member").post("/api/v1/jobs/", job_payload(array="0-3"), format="json").json()["id"]
    Job.objects.filter(pk=job_id).update(state=JobState.PENDING, slurm_job_id=4343)
    _use_broker(f"redis://127.0.0.1:{_closed_port()}/0")
    with django_capture_on_commit_callbacks(execute=True):
        response = api_client_for("member").post(f"/api/v1/jobs/{job_id}/cancel/?task=2")
    assert response.status_code == 202, response.content
    task = JobArrayTask.objects.get(job_id=job_id, index=2)
    assert (task.state, task.cancel_requested_at is not None) == (JobState.PENDING, True)  # asked for, not done
    assert Job.objects.get(pk=job_id).cancel_requested_at is None  # the job goes on

    broker.back()
    assert jobs_sweep()["task_cancels"] == 0  # not stale yet
    JobArrayTask.objects.filter(pk=task.pk).update(cancel_requested_at=timezone.now() - dt.timedelta(seconds=settings.JOB_ACCEPTED_SWEEP_SECONDS + 1))
    assert jobs_sweep()["task_cancels"] == 1
    assert ("jobs.tasks.job_array_task_cancel_relay", repr((str(job_id), 2))) in broker.sent()
    JobArrayTask.objects.filter(pk=task.pk).update(state=JobState.CANCELLED)  # passed on: the sweep leaves it
    assert jobs_sweep()["task_cancels"] == 0


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


# ---------------------------------------------------------------- re-pricing after a new rate


def _h100_usage() -> UsageSlice:
    usage_records_upsert(records=[acct(start=at(2026, 2, 3), hours=2, gpu_type="h100")])
    piece = UsageSlice.objects.get()
    assert piece.rate is None and piece.cost == 0  # no h100 rate yet
    return piece


def test_a_rate_added_with_the_broker_down_is_repriced_by_the_sweeper_once(world, broker, django_capture_on_commit_callbacks, caplog):
    _h100_usage()
    with django_capture_on_commit_callbacks(execute=True):
        rate_create(gpu_type="h100", price_per_gpu_hour=Decimal(16), effective_from=dt.date(2026, 1, 1))
    assert "accounting.tasks.usage_reprice_task" in caplog.text and broker.sent() == []
    assert UsageSlice.objects.get().cost == 0  # the re-pricing is owed, as a row
    assert list(PendingReprice.objects.values_list("gpu_type", "since")) == [("h100", dt.date(2026, 1, 1))]
    assert usage_reprice_sweep() == []  # too recent: its own enqueue may still be under way

    broker.back()
    later = timezone.now() + dt.timedelta(minutes=6)
    assert usage_reprice_sweep(now=later) == [("h100", "2026-01-01")]
    assert broker.sent() == [("accounting.tasks.usage_reprice_task", repr(("h100", "2026-01-01")))]
    assert usage_reprice_task("h100", "2026-01-01") == 1  # what the worker runs for that message
    piece = UsageSlice.objects.get()
    assert (piece.cost, piece.price_per_gpu_hour) == (Decimal(2 * 16), Decimal(16))
    assert not PendingReprice.objects.exists()
    # the sweep again, or the lost task after all: nothing owed, nothing rebuilt
    assert usage_reprice_sweep(now=later) == []
    assert usage_reprice_task("h100", "2026-01-01") is None
    assert UsageSlice.objects.get().pk == piece.pk
    assert broker.sent() == [("accounting.tasks.usage_reprice_task", repr(("h100", "2026-01-01")))]


def test_a_reprice_run_that_fails_hands_its_row_back_to_the_sweeper(world, monkeypatch):
    _h100_usage()
    rate = Rate.objects.create(gpu_type="h100", price_per_gpu_hour=Decimal(16), effective_from=dt.date(2026, 1, 1))
    usage_reprice_owed(gpu_type=rate.gpu_type, since=rate.effective_from)
    later = timezone.now() + dt.timedelta(minutes=6)

    def broken(**kwargs):
        assert PendingReprice.objects.get().started_at is not None  # held while it runs: the sweep leaves it
        assert usage_reprice_sweep(now=later) == []
        raise RuntimeError("database went away")

    monkeypatch.setattr(repricing, "usage_reprice", broken)
    with pytest.raises(RuntimeError):
        usage_reprice_pending(gpu_type="h100", since=dt.date(2026, 1, 1))
    assert PendingReprice.objects.get().started_at is None
    monkeypatch.undo()
    assert usage_reprice_sweep(now=later) == [("h100", "2026-01-01")]  # the broker is eager here: it ran
    assert UsageSlice.objects.get().cost == Decimal(32) and not PendingReprice.objects.exists()


def test_a_rate_added_while_a_reprice_runs_keeps_its_own_row(world, monkeypatch):
    """The run deletes the rows it claimed, not every row of the type: a rate committed after its
    start may be missing from the rate book it read."""
    _h100_usage()
    rate_create(gpu_type="h100", price_per_gpu_hour=Decimal(16), effective_from=dt.date(2026, 1, 1))  # owes 1 Jan on
    real = repricing.usage_reprice

    def with_a_new_rate_meanwhile(**kwargs):
        Rate.objects.create(gpu_type="h100", price_per_gpu_hour=Decimal(20), effective_from=dt.date(2026, 2, 1))
        PendingReprice.objects.create(gpu_type="h100", since=dt.date(2026, 2, 1))
        return real(**kwargs)

    monkeypatch.setattr(repricing, "usage_reprice", with_a_new_rate_meanwhile)
    assert usage_reprice_pending(gpu_type="h100", since=dt.date(2026, 1, 1)) == 1
    assert list(PendingReprice.objects.values_list("since", flat=True)) == [dt.date(2026, 2, 1)]


# ---------------------------------------------------------------- job-end e-mails


def _ended_with_the_broker_down(world, django_capture_on_commit_callbacks, caplog) -> list[Job]:
    Profile.objects.filter(user=world.alice).update(notify_job_end=True)
    mine = make_job(world.vision, world.alice, state=JobState.RUNNING, slurm_job_id=6161, name="train-a")
    bobs = make_job(world.vision, world.bob, state=JobState.RUNNING, slurm_job_id=6162, name="train-b")  # not opted in
    now = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        _apply_plan({job.pk: {"state": JobState.COMPLETED, "exit_code": 0, "ended_at": now} for job in (mine, bobs)}, now)
    assert "jobs.tasks.job_end_notify" in caplog.text and "not enqueued" in caplog.text
    assert mail.outbox == []
    return [mine, bobs]


def test_job_end_emails_lost_with_the_broker_are_sent_once_by_the_sweeper(world, broker, django_capture_on_commit_callbacks, caplog):
    mine, bobs = _ended_with_the_broker_down(world, django_capture_on_commit_callbacks, caplog)
    assert job_end_notify_sweep() == []  # too recent: the sync's own task may still be under way

    broker.back()
    later = timezone.now() + dt.timedelta(minutes=6)
    ids = job_end_notify_sweep(now=later)
    assert sorted(ids) == sorted([str(mine.pk), str(bobs.pk)])
    assert broker.sent() == [("jobs.tasks.job_end_notify", repr((ids,)))]
    assert job_end_notify_send(job_ids=ids) == 1  # what the worker runs for that message
    assert [m.to for m in mail.outbox] == [[world.alice.email]] and "train-a" in mail.outbox[0].subject
    assert Job.objects.filter(pk__in=ids, end_notified_at__isnull=False).count() == 2  # bob's: not wanted, dealt with
    # the sweep again, and the lost task after all: nothing sent twice
    assert job_end_notify_sweep(now=later) == []
    assert job_end_notify_send(job_ids=ids) == 0
    assert len(mail.outbox) == 1 and len(broker.sent()) == 1


def test_the_sweep_leaves_jobs_that_never_reached_slurm_and_old_ends(world):
    Profile.objects.filter(user=world.alice).update(notify_job_end=True)
    long_ago = timezone.now() - dt.timedelta(days=3)
    make_job(world.vision, world.alice, state=JobState.CANCELLED, ended_at=timezone.now() - dt.timedelta(hours=1))  # no Slurm id
    make_job(world.vision, world.alice, state=JobState.COMPLETED, slurm_job_id=6170, ended_at=long_ago)
    owed = make_job(world.vision, world.alice, state=JobState.COMPLETED, slurm_job_id=6171,
                    ended_at=timezone.now() - dt.timedelta(hours=1))  # fmt: skip
    assert job_end_notify_sweep() == [str(owed.pk)]  # the broker is eager here: it ran
    assert [m.to for m in mail.outbox] == [[world.alice.email]]


def test_an_smtp_failure_hands_the_unsent_notices_back(world, monkeypatch):
    from django.core.mail.backends.locmem import EmailBackend

    Profile.objects.filter(user=world.alice).update(notify_job_end=True)
    ended = timezone.now() - dt.timedelta(hours=1)
    jobs = [make_job(world.vision, world.alice, state=JobState.FAILED, slurm_job_id=6180 + i, name=f"j{i}",
                     ended_at=ended + dt.timedelta(seconds=i)) for i in range(2)]  # fmt: skip
    ids = [str(job.pk) for job in jobs]
    real, calls = EmailBackend.send_messages, []

    def second_fails(self, messages):
        calls.append(messages)
        if len(calls) == 2:
            raise OSError("connection reset")
        return real(self, messages)

    monkeypatch.setattr(EmailBackend, "send_messages", second_fails)
    with pytest.raises(OSError):
        job_end_notify_send(job_ids=ids)
    assert [m.subject for m in mail.outbox] == ["[gpuportal] j0: FAILED"]
    assert list(Job.objects.filter(end_notified_at__isnull=True).values_list("name", flat=True)) == ["j1"]
    monkeypatch.undo()
    assert job_end_notify_send(job_ids=ids) == 1  # the retry sends only what was not sent
    assert [m.subject for m in mail.outbox] == ["[gpuportal] j0: FAILED", "[gpuportal] j1: FAILED"]


# ---------------------------------------------------------------- the beat


SWEEPERS = {
    "jobs-sweep-accepted": "jobs.tasks.jobs_sweep_task",
    "booking-cleanup": "accounting.tasks.booking_cleanup_task",
    "quota-rollover": "accounting.tasks.quota_rollover_task",
    "team-mirror-sweep": "portal.tasks.team_mirror_sweep_task",
    "budget-alert-sweep": "accounting.tasks.budget_alert_sweep_task",
    "budget-alert-webhook-sweep": "accounting.tasks.budget_alert_webhook_sweep_task",
    "usage-reprice-sweep": "accounting.tasks.usage_reprice_sweep_task",
    "job-end-notify-sweep": "jobs.tasks.job_end_notify_sweep_task",
    "budget-hold-sweep": "jobs.tasks.budget_holds_sweep_task",
}


def test_the_beat_runs_every_sweeper_at_its_setting(settings):
    import accounting.tasks  # noqa: F401 (the imports register the tasks)
    import jobs.tasks  # noqa: F401
    import portal.tasks  # noqa: F401
    from portal.project.celery import _beat_schedule, app

    settings.USAGE_REPRICE_SWEEP_SECONDS, settings.JOB_END_NOTIFY_SWEEP_SECONDS, settings.BUDGET_HOLD_SWEEP_SECONDS = 61, 62, 630
    settings.BUDGET_ALERT_WEBHOOK_SWEEP_SECONDS = 63
    schedule = _beat_schedule()
    assert {key: schedule[key]["task"] for key in SWEEPERS if key in schedule} == SWEEPERS
    assert all(task in app.tasks for task in SWEEPERS.values())  # each names a real task
    keys = ("usage-reprice-sweep", "job-end-notify-sweep", "budget-hold-sweep", "budget-alert-webhook-sweep")
    assert [schedule[key]["schedule"] for key in keys] == [61.0, 62.0, 630.0, 63.0]


# ---------------------------------------------------------------- the outbox is the one way to enqueue

ENQUEUE_METHODS = {"delay", "apply_async", "send_task"}
# Files of jobs/, accounting/ and portal/ that may hand a task to the broker themselves, and why.
BARE_ENQUEUE_ALLOWED = {
    "portal/outbox.py": "the outbox itself: publish() is the one call of task.delay, with the one policy",
}


def _bare_enqueues(source: str) -> list[tuple[int, str]]:
    """(line, method) of each call of ``.delay(`` / ``.apply_async(`` / ``.send_task(`` in ``source``."""
    calls = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)]
    return sorted(
        (node.lineno, node.func.attr)
        for node in calls
        if isinstance(node.func, ast.Attribute) and node.func.attr in ENQUEUE_METHODS
    )


def test_the_scan_finds_every_kind_of_bare_enqueue():
    source = "task.delay(1)\nx = app.send_task('t')\nif y:\n    sig(f()).apply_async(args=[1])\npublish(task, 1)\n"
    assert _bare_enqueues(source) == [(1, "delay"), (2, "send_task"), (4, "apply_async")]


def test_nothing_in_the_apps_enqueues_outside_the_outbox():
    root = Path(__file__).resolve().parents[2]
    assert all((root / name).is_file() for name in BARE_ENQUEUE_ALLOWED)  # no stale entry
    found = []
    for app in ("jobs", "accounting", "portal"):
        for path in sorted((root / app).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            if name not in BARE_ENQUEUE_ALLOWED:
                found += [f"{name}:{line}: .{method}(" for line, method in _bare_enqueues(path.read_text())]
    assert found == [], "enqueue through portal.outbox (after_commit in a transaction, publish outside one)"


# ---------------------------------------------------------------- cancels asked while a relay submits


class _CancelledWhileSubmitting(FakeGateway):
    """sbatch answers after the user asked to cancel: the request lands between submit and record."""

    def submit(self, spec):
        Job.objects.filter(pk=dict(spec.command_line)["comment"].removeprefix("gpuportal:")).update(cancel_requested_at=timezone.now())
        return super().submit(spec)


@pytest.mark.django_db(transaction=True)  # the batched relay calls sbatch from its pool's threads
@pytest.mark.parametrize("relay", ["single", "batch"])
def test_a_cancel_the_relay_cannot_enqueue_is_logged_and_sent_once_by_the_sweeper(world, broker, use_gateway, settings, caplog, relay):
    settings.SLURM_SUBMIT_AS_USER = False  # no Unix accounts needed for the fake
    gateway = use_gateway(_CancelledWhileSubmitting())
    job = make_job(world.vision, world.alice)
    if relay == "single":
        assert job_relay_run(job.pk) == "submitted"
    else:
        assert job_relay_batch_run([job.pk])["submitted"] == 1
    job.refresh_from_db()
    assert (job.state, job.slurm_job_id, job.cancel_sent_at) == (JobState.PENDING, 1001, None)
    assert job.cancel_requested_at is not None
    assert "jobs.tasks.job_cancel_relay" in caplog.text and "not enqueued" in caplog.text
    assert gateway.cancelled == []

    broker.back()
    Job.objects.filter(pk=job.pk).update(cancel_requested_at=timezone.now() - dt.timedelta(seconds=settings.JOB_ACCEPTED_SWEEP_SECONDS + 1))
    assert jobs_sweep() == {"relays": 0, "cancels": 1, "task_cancels": 0}
    assert broker.sent() == [("jobs.tasks.job_cancel_relay", repr((str(job.pk),)))]
    assert job_cancel_relay_run(job.pk) == "sent"  # what the worker runs for that message
    assert gateway.cancelled == [1001]
    assert jobs_sweep() == {"relays": 0, "cancels": 0, "task_cancels": 0}  # sent: the sweep leaves it
    assert len(broker.sent()) == 1


# ---------------------------------------------------------------- booking reservations


def test_a_booking_approved_with_the_broker_down_is_reserved_once_by_the_cleanup(
    world, broker, api_client_for, use_gateway, settings, django_capture_on_commit_callbacks, caplog
):
    settings.BOOKING_RESERVE_WHOLE_NODES, settings.BOOKING_AUTO_APPROVE_GPU_HOURS, settings.TIME_ZONE = "yes", 32, "UTC"
    make_inventory()
    gateway = use_gateway(FakeGateway())
    payload = {"team": "vision", "gpu_type": "a100", "gpus": 4, "start": day_at(9).isoformat(), "end": day_at(10).isoformat()}
    with django_capture_on_commit_callbacks(execute=True):
        response = api_client_for("manager").post("/api/v1/bookings/", payload, format="json")
    assert response.status_code == 201, response.json()
    booking = Booking.objects.get(pk=response.json()["id"])
    assert (booking.status, booking.reservation_state) == (BookingStatus.APPROVED, ReservationState.PENDING)
    assert "accounting.tasks.booking_reserve_task" in caplog.text and "not enqueued" in caplog.text

    Booking.objects.filter(pk=booking.pk).update(reservation_updated_at=timezone.now() - dt.timedelta(minutes=2))
    caplog.clear()
    assert booking_cleanup() == {"deleted": 0, "marked": 0, "requeued": 0}  # still down: logged, next time
    assert "accounting.tasks.booking_reserve_task" in caplog.text and "not enqueued" in caplog.text
    broker.back()
    assert booking_cleanup() == {"deleted": 0, "marked": 0, "requeued": 1}
    assert broker.sent() == [("accounting.tasks.booking_reserve_task", repr((str(booking.pk),)))]
    assert booking_reserve_run(booking.pk) == "created"  # what the worker runs for that message
    assert list(gateway.reservations) == [booking.reservation_name]
    assert booking_cleanup()["requeued"] == 0  # reserved: the cleanup leaves it
    assert booking_reserve_run(booking.pk) == "not-claimed" and gateway.calls["reservation_create"] == 1
    assert len(broker.sent()) == 1


# ---------------------------------------------------------------- budget-alert webhooks


@pytest.fixture
def hook(monkeypatch, world):
    """vision's alert webhook: each POST's JSON is recorded in ``hook.received``; ``hook.fail`` (an
    exception) is raised instead while set."""
    world.vision.alert_webhook_url = "https://hooks.example.org/gpu"
    world.vision.save(update_fields=["alert_webhook_url"])

    class Hook:
        received: list = []  # noqa: RUF012 (one per test: set below)
        fail: Exception | None = None

    Hook.received = []

    def urlopen(request, timeout):
        assert request.full_url == world.vision.alert_webhook_url and request.get_method() == "POST"
        if Hook.fail is not None:
            raise Hook.fail
        Hook.received.append(json.loads(request.data))
        return contextlib.nullcontext(io.BytesIO(b""))

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return Hook


def _alert(world, **fields) -> BudgetAlert:
    quota = Quota.objects.filter(team=world.vision).first()
    return BudgetAlert.objects.create(**{"quota": quota, "threshold": 80, "consumed_gpu_hours": 800, "budget_gpu_hours": 1000, **fields})


def test_a_webhook_lost_with_the_broker_after_the_email_is_sent_once_by_its_sweeper(world, broker, hook, caplog):
    alert = _alert(world)
    budget_alert_deliver_task(alert.pk)  # what the worker runs: the e-mail goes, the webhook's enqueue fails
    assert len(mail.outbox) == 1
    assert "accounting.tasks.budget_alert_webhook_task" in caplog.text and "not enqueued" in caplog.text
    assert hook.received == []
    assert budget_alert_webhook_sweep() == []  # too recent: its own task may still be under way

    broker.back()
    later = timezone.now() + dt.timedelta(minutes=6)
    assert budget_alert_webhook_sweep(now=later) == [alert.pk]
    assert broker.sent() == [("accounting.tasks.budget_alert_webhook_task", repr((alert.pk,)))]
    budget_alert_webhook_task(alert.pk)  # what the worker runs for that message
    assert [(h["team"], h["threshold_percent"], h["quota_id"]) for h in hook.received] == [("vision", 80, alert.quota_id)]
    alert.refresh_from_db()
    assert alert.webhook_delivered_at is not None and alert.webhook_attempts == 1
    # the sweep again, and the lost task after all: nothing sent twice
    assert budget_alert_webhook_sweep(now=later) == []
    assert budget_alert_webhook(alert_id=alert.pk) is False
    assert len(hook.received) == 1 and len(broker.sent()) == 1 and len(mail.outbox) == 1


def test_a_webhook_is_claimed_before_it_is_posted_and_a_failed_post_hands_the_claim_back(world, hook):
    alert = _alert(world, emailed_at=timezone.now() - dt.timedelta(minutes=10))
    hook.fail = urllib.error.URLError("connection refused")
    with pytest.raises(urllib.error.URLError):
        budget_alert_webhook(alert_id=alert.pk)
    alert.refresh_from_db()
    assert (alert.webhook_claimed_at, alert.webhook_delivered_at, alert.webhook_attempts) == (None, None, 1)
    assert "connection refused" in alert.webhook_error
    hook.fail = None

    # another worker holds the claim (its POST in flight): neither the task nor the sweep sends
    BudgetAlert.objects.filter(pk=alert.pk).update(webhook_claimed_at=timezone.now(), webhook_attempts=2)
    assert budget_alert_webhook(alert_id=alert.pk) is False
    assert budget_alert_webhook_sweep() == []
    assert hook.received == []
    # that worker died: past its lease the sweep enqueues it again (the broker is eager here: it ran)
    BudgetAlert.objects.filter(pk=alert.pk).update(webhook_claimed_at=timezone.now() - WEBHOOK_LEASE)
    assert budget_alert_webhook_sweep() == [alert.pk]
    assert len(hook.received) == 1
    alert.refresh_from_db()
    assert alert.webhook_delivered_at is not None and alert.webhook_attempts == 3 and alert.webhook_error == ""
    assert budget_alert_webhook_sweep() == [] and budget_alert_webhook(alert_id=alert.pk) is False
    assert len(hook.received) == 1


def test_the_webhook_sweep_leaves_spent_attempts_teams_without_a_webhook_and_alerts_not_emailed(world, hook):
    emailed = timezone.now() - dt.timedelta(minutes=10)
    spent = _alert(world, emailed_at=emailed, webhook_attempts=WEBHOOK_ATTEMPTS, webhook_error="HTTP Error 500")
    not_emailed = _alert(world, threshold=100)  # budget_alert_sweep's: its deliver task hands the webhook on
    nlp_quota = Quota.objects.filter(team=world.nlp).first()
    no_hook = BudgetAlert.objects.create(quota=nlp_quota, threshold=80, consumed_gpu_hours=8, budget_gpu_hours=10, emailed_at=emailed)
    assert budget_alert_webhook_sweep() == []
    assert budget_alert_webhook(alert_id=spent.pk) is False and budget_alert_webhook(alert_id=no_hook.pk) is False
    assert hook.received == []
    assert budget_alert_webhook(alert_id=not_emailed.pk) is True  # its own task may send it
    assert len(hook.received) == 1
