"""Fault injection against the real local cluster, a real Celery worker, a real (dedicated) Redis
and PostgreSQL: a worker SIGKILLed mid-burst, slurmctld down for 60 s, the broker restarted (its
messages lost), the database connection dropped mid-cycle. Every job reaches Slurm exactly once
(counted in Slurm by its tag ``gpuportal:<uuid>``), none is left ACCEPTED, no state goes back.

Beat does not run in tests: the tests run the sweeper (``jobs_sweep``) themselves, as beat would.
Figures are printed (run with ``-s`` to see them)."""

from __future__ import annotations

import subprocess
import time

import pytest
from django.db import InterfaceError, OperationalError, close_old_connections, connection, connections
from django.test import Client
from rest_framework.test import APIClient

from jobs import services
from jobs.choices import _RANK, TERMINAL_STATES, JobState
from jobs.models import Job, JobEvent
from jobs.services import jobs_sync
from portal.slurm import SlurmError, get_gateway
from tests.conftest import ROOT
from tests.faults.conftest import (
    assert_each_job_in_slurm_exactly_once,
    cancel_live_jobs_of_this_test,
    recover,
    slurm_ids_by_tag,
    submit_tiny,
)
from tests.support import job_payload, slurm_tags, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.slurm]


def _report(title: str, figures: dict) -> None:
    print(f"\n[faults] {title}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))


def _adopted_by_tag(ids) -> int:
    return JobEvent.objects.filter(job_id__in=ids, reason__startswith="Found in Slurm by its tag").count()


# ---------------------------------------------------------------- the worker SIGKILLed twice


@pytest.mark.celery
def test_worker_sigkilled_twice_during_a_200_job_burst_every_job_reaches_slurm_exactly_once(faults, cluster):
    n, kill_at = 200, (60, 130)
    ids = []
    started = time.monotonic()
    restart_wait = 0.0
    for i in range(n):
        ids.append(submit_tiny(cluster, f"kill-{i}").pk)
        if i in kill_at:
            faults.worker.kill()
            faults.worker.start(wait=False)
            restart_wait += faults.worker.wait_ready()
    burst = time.monotonic() - started
    figures = recover(ids, timeout=120, worker=faults.worker)
    result = assert_each_job_in_slurm_exactly_once(ids, faults.since)
    _report(
        "worker SIGKILL x2",
        {
            "jobs": n, "kills": faults.worker.kills, "burst_s": round(burst, 1),
            "submit_rate_jobs_per_s": round(n / (burst - restart_wait), 1), "worker_restart_s": round(restart_wait, 1),
            "recovery_s": figures["seconds"], "sweeps": figures["sweeps"], "re_enqueued": figures["re_enqueued"],
            "adopted_by_tag": _adopted_by_tag(ids), "relay_attempts": result["relay_attempts"],
            "total_s": round(time.monotonic() - started, 1),
        },
    )  # fmt: skip
    assert faults.worker.kills == 2


# ---------------------------------------------------------------- the worker SIGKILLed mid-drain


@pytest.mark.celery
def test_worker_sigkilled_while_a_drain_relays_its_batch_every_job_reaches_slurm_exactly_once(faults, cluster):
    """The group commit's crash window: a drain (jobs.services.job_relay_drain_run) has claimed a
    batch and sent part of it to Slurm, and dies before its one bulk write. Its claims expire (the
    lease), the sweeper's drain claims them again and adopts by tag what Slurm already holds."""
    n = 150
    faults.worker.kill()  # no worker yet: the burst waits ACCEPTED behind its one drain message
    ids = [submit_tiny(cluster, f"drain-kill-{i}").pk for i in range(n)]
    tags = {job.slurm_tag: job.pk for job in Job.objects.filter(pk__in=ids)}
    started = time.monotonic()
    faults.worker.start(wait=False)
    # the first of the batch in Slurm: the drain is between its sbatch calls and its bulk write
    while not (set(tags) & slurm_tags()):
        assert time.monotonic() - started < 90, "the drain sent nothing to Slurm within 90 s"
    faults.worker.kill()
    in_slurm = set(tags) & slurm_tags()
    claimed = Job.objects.filter(pk__in=ids, state=JobState.ACCEPTED, relay_token__isnull=False).count()
    unrecorded = Job.objects.filter(pk__in=[tags[t] for t in in_slurm], slurm_job_id__isnull=True).count()
    figures = recover(ids, timeout=150, worker=faults.worker)
    result = assert_each_job_in_slurm_exactly_once(ids, faults.since)
    adopted = _adopted_by_tag(ids)
    _report(
        "worker SIGKILL mid-drain",
        {
            "jobs": n, "claimed_by_the_dead_drain": claimed, "in_slurm_unrecorded_at_kill": unrecorded,
            "recovery_s": figures["seconds"], "sweeps": figures["sweeps"], "adopted_by_tag": adopted,
            "relay_attempts": result["relay_attempts"], "total_s": round(time.monotonic() - started, 1),
        },
    )  # fmt: skip
    assert claimed > 0 and unrecorded > 0, "the kill missed the window between sbatch and the write"
    assert adopted >= unrecorded


# ---------------------------------------------------------------- slurmctld down for 60 s


def _cluster(command: str) -> None:
    subprocess.run([str(ROOT / "scripts" / "cluster"), command], check=True, timeout=120, capture_output=True)


@pytest.mark.celery
def test_slurmctld_down_60s_during_a_burst_jobs_wait_accepted_health_says_down_then_each_reaches_slurm_once(
    faults, cluster
):
    from portal.services import cluster_sync

    web = Client()
    before = [submit_tiny(cluster, f"pre-{i}").pk for i in range(5)]
    recover(before, timeout=30)
    during: list = []
    health_during = None
    sync_error = None
    started = time.monotonic()
    _cluster("ctld-stop")
    try:
        outage_started = time.monotonic()
        last_sweep = time.monotonic()
        while time.monotonic() - outage_started < 60:
            during.append(submit_tiny(cluster, f"outage-{len(during)}").pk)
            if sync_error is None and time.monotonic() - outage_started > 2:
                try:
                    cluster_sync()  # what the workers' periodic inventory read does
                except SlurmError as exc:
                    sync_error = str(exc)
                health_during = web.get("/healthz")
            if time.monotonic() - last_sweep >= 15:  # beat's sweep interval
                services.jobs_sweep()
                last_sweep = time.monotonic()
            time.sleep(1.0)  # time must pass: the outage lasts 60 s, and a client submits once a second
        waiting = set(Job.objects.filter(pk__in=during).values_list("state", flat=True))
        in_slurm = Job.objects.filter(pk__in=during, slurm_job_id__isnull=False).count()
    finally:
        _cluster("ctld-start")
    outage = time.monotonic() - outage_started

    assert sync_error is not None, "the cluster read should fail while slurmctld is down"
    assert health_during.status_code == 503 and "slurm" in health_during.json()["failing"], health_during.json()
    assert waiting == {JobState.ACCEPTED} and in_slurm == 0

    figures = recover(during, timeout=120, sweep_every=3, worker=faults.worker)
    cluster_sync()
    assert web.get("/healthz").json()["checks"]["slurm"]["ok"] is True
    result = assert_each_job_in_slurm_exactly_once(before + during, faults.since)
    relay_errors = Job.objects.filter(pk__in=during).exclude(last_relay_error="").count()
    _report(
        "slurmctld down",
        {
            "outage_s": round(outage, 1), "submitted_during": len(during), "recovery_s": figures["seconds"],
            "sweeps_after": figures["sweeps"], "re_enqueued_after": figures["re_enqueued"],
            "relay_attempts": result["relay_attempts"], "jobs_with_last_relay_error": relay_errors,
            "total_s": round(time.monotonic() - started, 1), "sync_error": sync_error[:80],
        },
    )  # fmt: skip


# ---------------------------------------------------------------- the broker restarted


@pytest.mark.celery
def test_broker_restarted_mid_burst_lost_messages_are_re_enqueued_and_each_job_reaches_slurm_once(faults, cluster):
    api = APIClient()
    api.force_authenticate(user=cluster.alice)
    ids = []
    started = time.monotonic()
    broker_down_statuses = []
    for i in range(120):
        if i == 40:
            faults.redis.restart()  # queued and unacknowledged messages are gone
        if i == 80:
            faults.redis.kill()  # down for a few submissions: the API must still answer 201
            for j in range(3):
                response = api.post(
                    "/api/v1/jobs/", job_payload(name=f"nobroker-{j}", script="#!/bin/bash\ntrue\n", partition="debug",
                                                 gpu_type="", gpus=1, time_limit_minutes=1, memory_gb=None), format="json",
                )  # fmt: skip
                broker_down_statuses.append(response.status_code)
                if response.status_code == 201:
                    ids.append(response.json()["id"])
            faults.redis.start()
            faults.redis.restarts += 1
        ids.append(submit_tiny(cluster, f"broker-{i}").pk)
        faults.worker.supervise()  # systemd's Restart=always
    burst = time.monotonic() - started
    assert broker_down_statuses == [201, 201, 201]
    figures = recover(ids, timeout=120, worker=faults.worker)
    result = assert_each_job_in_slurm_exactly_once(ids, faults.since)
    _report(
        "redis restarted",
        {
            "jobs": len(ids), "restarts": faults.redis.restarts, "worker_exits": faults.worker.exits, "burst_s": round(burst, 1),
            "recovery_s": figures["seconds"], "sweeps": figures["sweeps"], "re_enqueued": figures["re_enqueued"],
            "relay_attempts": result["relay_attempts"], "total_s": round(time.monotonic() - started, 1),
        },
    )  # fmt: skip


# ---------------------------------------------------------------- the database connection dropped


def _terminate_my_backend(wrapper=connection) -> None:
    """pg_terminate_backend of a database connection of this process (``wrapper``, a thread's
    DatabaseWrapper; by default this thread's), from another connection."""
    import psycopg
    from django.conf import settings

    pid = wrapper.connection.info.backend_pid
    db = settings.DATABASES["default"]
    with psycopg.connect(
        host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"], password=db.get("PASSWORD") or None,
        dbname=db["NAME"], autocommit=True,
    ) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


def _snapshot(ids) -> dict:
    return dict(Job.objects.filter(pk__in=ids).values_list("pk", "state"))


def _assert_no_state_went_back(before: dict, after: dict) -> None:
    for pk, old in before.items():
        new = after[pk]
        if old == new:
            continue
        assert old not in TERMINAL_STATES, f"{pk}: left terminal state {old} for {new}"
        assert new in TERMINAL_STATES or new == JobState.REQUEUED or _RANK[new] >= _RANK[old], f"{pk}: {old} -> {new}"


@pytest.mark.django_db(transaction=True)
def test_database_connection_dropped_mid_sync_and_mid_relay_the_next_cycle_recovers_and_no_state_goes_back(
    cluster, monkeypatch, use_gateway
):
    # Jobs really in Slurm (eager relays), plus one whose relay loses the database right after sbatch.
    ids = [submit_tiny(cluster, f"db-{i}", script="#!/bin/bash\nsleep 2\n").pk for i in range(8)]
    real = get_gateway()
    mine = connections["default"]  # this thread's: the relay calls sbatch from its pool threads

    class DroppingGateway:
        drop_on = "queue"

        def __getattr__(self, name):
            attr = getattr(real, name)
            if name != self.drop_on:
                return attr

            def dropping(*args, **kwargs):
                value = attr(*args, **kwargs)
                _terminate_my_backend(mine)  # the answer from Slurm arrives; the database is gone
                return value

            return dropping

    gateway = use_gateway(DroppingGateway())

    # 1. mid-relay: sbatch succeeded, the write of its id fails
    gateway.drop_on = "submit"
    with pytest.raises((OperationalError, InterfaceError)):
        orphan = submit_tiny(cluster, "db-orphan", script="#!/bin/bash\nsleep 2\n")
    close_old_connections()  # what Celery's Django fix-up does before and after every task
    orphan = Job.objects.get(name="db-orphan")
    assert orphan.state == JobState.ACCEPTED and orphan.slurm_job_id is None
    ids.append(orphan.pk)

    # 2. mid-sync: squeue answered, then the connection dies before the writes
    gateway.drop_on = "queue"
    before = _snapshot(ids)
    with pytest.raises((OperationalError, InterfaceError)):
        jobs_sync()
    close_old_connections()
    assert _snapshot(ids) == before  # nothing half-written

    # 3. the next cycles recover (the orphan is adopted by its tag), and no state goes back
    gateway.drop_on = ""
    history = [before]

    def cycle() -> bool:
        """One sync cycle (what beat runs); no state goes back; True once every job has ended."""
        jobs_sync()
        history.append(_snapshot(ids))
        _assert_no_state_went_back(history[-2], history[-1])
        return set(history[-1].values()) <= TERMINAL_STATES

    wait_for(cycle, timeout=90, interval=0.5, what="the jobs to end after the database came back")
    assert set(history[-1].values()) == {JobState.COMPLETED}, history[-1]
    orphan.refresh_from_db()
    found = slurm_ids_by_tag({orphan.slurm_tag}, orphan.created_at)
    assert found[orphan.slurm_tag] == {orphan.slurm_job_id}
    for pk in ids:
        states = list(JobEvent.objects.filter(job_id=pk).order_by("at", "pk").values_list("state", flat=True))
        assert len(states) == len(set(states)) and states[-1] == JobState.COMPLETED, (pk, states)
    _report("database dropped", {"jobs": len(ids), "cycles_to_finish": len(history) - 1})
    cancel_live_jobs_of_this_test()
