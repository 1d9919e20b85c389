"""The relay drain: the group commit of single-job submissions (jobs.services.job_relay_drain_run,
the ``job_relay_drain`` task). A burst of submits publishes about one drain (the coalescing outbox,
portal/outbox.py); a drain claims the waiting jobs in bounded batches (one UPDATE, SKIP LOCKED) and
relays each exactly once on the real cluster; drains running at once never submit a job twice; a
drain after a crash following sbatch adopts by tag; through a real Celery worker a burst of single
submits reaches Slurm once each in fewer drain runs than jobs. (The worker killed mid-drain:
tests/faults/test_faults.py.)"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from jobs import services, tasks
from jobs.choices import JobState
from jobs.models import Job, JobEvent
from jobs.services import job_relay_drain_run, job_submit, relay_drain_key
from portal.outbox import coalesced_done
from tests.conftest import ROOT
from tests.faults.conftest import assert_each_job_in_slurm_exactly_once
from tests.support import (
    job_payload,
    relay_crashed_after_sbatch,
    slurm_cancel_tagged,
    slurm_tag_counts,
    wait_for,
)

pytestmark = pytest.mark.django_db


def _submit(world, name: str, *, script: str = "#!/bin/bash\nsleep 60\n") -> Job:
    job, _ = job_submit(user=world.alice, team=world.vision, name=name, script=script, partition="debug", gpus=1,
                        time_limit_minutes=2)  # fmt: skip
    return job


@pytest.fixture
def drains(monkeypatch):
    """The drains submits publish, recorded (not run): a list that grows by one per publish."""
    published: list[None] = []
    monkeypatch.setattr(tasks.job_relay_drain, "delay", lambda: published.append(None))
    return published


# ---------------------------------------------------------------- the coalescing outbox


def test_a_burst_of_submits_publishes_one_drain_until_the_drain_clears_its_flag(
    world, inventory, drains, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        for i in range(5):
            _submit(world, f"burst-{i}")
    assert len(drains) == 1  # the first commit published; the other four found the flag up
    coalesced_done(relay_drain_key())  # what a drain does before its last look
    with django_capture_on_commit_callbacks(execute=True):
        _submit(world, "after")
    assert len(drains) == 2


def test_a_submit_publishes_its_drain_when_the_flag_store_does_not_answer(
    world, inventory, drains, monkeypatch, django_capture_on_commit_callbacks
):
    import portal.outbox

    class Down:
        def set(self, *args, **kwargs):
            raise redis.exceptions.ConnectionError("flag store down")

        delete = set

    monkeypatch.setattr(portal.outbox, "_flags", Down)
    with django_capture_on_commit_callbacks(execute=True):
        for i in range(3):
            _submit(world, f"nocache-{i}")
    assert len(drains) == 3  # a drain too many is harmless, one too few would wait for the sweeper


# ---------------------------------------------------------------- the drain on the real cluster


@pytest.mark.slurm
def test_drain_claims_in_bounded_batches_and_submits_each_job_once(cluster, drains):
    since = timezone.now()
    jobs = [_submit(cluster, f"d-{i}") for i in range(7)]
    try:
        result = job_relay_drain_run(limit=3)
        assert (result["rounds"], result["claimed"], result["submitted"]) == (3, 7, 7)  # 3 + 3 + 1
        assert job_relay_drain_run(limit=3)["claimed"] == 0  # a second drain finds nothing
        assert assert_each_job_in_slurm_exactly_once([j.pk for j in jobs], since)["relay_attempts"] == {1: 7}
        assert not Job.objects.filter(pk__in=[j.pk for j in jobs], relay_token__isnull=False).exists()
        assert JobEvent.objects.filter(job__in=jobs, state=JobState.PENDING).count() == 7
    finally:
        slurm_cancel_tagged(jobs)


@pytest.mark.slurm
def test_drain_leaves_a_job_with_a_live_lease_to_its_holder_and_adopts_after_a_crash(cluster, drains):
    held, crashed, fresh = (_submit(cluster, name) for name in ("held", "crashed", "fresh"))
    assert len(services._claim([held.pk])[1]) == 1  # another relay holds it right now
    first_id = relay_crashed_after_sbatch(crashed)
    try:
        result = job_relay_drain_run()
        assert (result["claimed"], result["adopted"], result["submitted"]) == (2, 1, 1)
        crashed.refresh_from_db()
        assert (crashed.slurm_job_id, crashed.state, crashed.relay_attempts) == (first_id, JobState.PENDING, 2)
        held.refresh_from_db()
        assert (held.state, held.slurm_job_id) == (JobState.ACCEPTED, None)
        counts = slurm_tag_counts([crashed, fresh])
        assert counts == {crashed.slurm_tag: 1, fresh.slurm_tag: 1}
    finally:
        slurm_cancel_tagged([held, crashed, fresh])


@pytest.mark.slurm
@pytest.mark.django_db(transaction=True)
def test_concurrent_drains_never_submit_a_job_twice(cluster, drains):
    since = timezone.now()
    jobs = [_submit(cluster, f"c-{i}", script="#!/bin/bash\ntrue\n") for i in range(40)]
    barrier = threading.Barrier(4)

    def drain(_):
        try:
            barrier.wait()
            return job_relay_drain_run(limit=5)
        finally:
            connection.close()

    try:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(drain, range(4)))
        assert sum(r["submitted"] for r in results) == 40
        assert sum(r["claimed"] for r in results) == 40  # no job claimed by two drains
        assert sum(1 for r in results if r["submitted"]) >= 2, results  # they did run side by side
        # what Slurm holds (queue, or accounting once a `true` job has left it): one job per tag, the recorded one
        figures = assert_each_job_in_slurm_exactly_once([j.pk for j in jobs], since)
        assert figures["relay_attempts"] == {1: 40}
    finally:
        slurm_cancel_tagged(jobs)


# ---------------------------------------------------------------- through a real Celery worker


def _worker_log():
    """The log of this session's worker (tests/conftest.py _start_worker)."""
    return ROOT / ".run" / f"test-celery-jobs-tests-{os.getpid()}.log"


@pytest.mark.slurm
@pytest.mark.celery
def test_a_burst_of_single_submits_reaches_slurm_once_each_in_fewer_drain_runs_than_jobs(real_worker, cluster, monkeypatch):
    n, clients = 40, 4
    published = []
    real_delay = tasks.job_relay_drain.delay
    monkeypatch.setattr(tasks.job_relay_drain, "delay", lambda: published.append(None) or real_delay())
    log = _worker_log()
    log_start = log.stat().st_size
    ids: list[str] = []
    lock = threading.Lock()
    names = iter(range(n))

    def client(_):
        api = APIClient()
        api.force_authenticate(user=cluster.alice)
        try:
            while True:
                with lock:
                    i = next(names, None)
                if i is None:
                    return
                response = api.post("/api/v1/jobs/", job_payload(name=f"burst-{i}", script="#!/bin/bash\nsleep 60\n",
                                    partition="debug", gpu_type="", gpus=1, time_limit_minutes=2, memory_gb=None), format="json")  # fmt: skip
                assert response.status_code == 201, response.json()
                with lock:
                    ids.append(response.json()["id"])
        finally:
            connection.close()

    started, since = time.monotonic(), timezone.now()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    jobs = list(Job.objects.filter(pk__in=ids))
    try:
        wait_for(lambda: not Job.objects.filter(pk__in=ids, state=JobState.ACCEPTED).exists(), timeout=120, interval=0.1)
        seconds = time.monotonic() - started
        assert_each_job_in_slurm_exactly_once(ids, since)
        # every drain that ran, as the worker logged it (its log is this session's: read from our offset)
        runs = wait_for(lambda: log.read_text()[log_start:].count("job relay drain: "), timeout=10)
        print(f"\n[drain] {n} jobs from {clients} clients: {len(published)} drains published, {runs} ran, "
              f"{seconds:.1f} s to the last Slurm id")  # fmt: skip
        assert 1 <= runs < n and len(published) < n
    finally:
        slurm_cancel_tagged(jobs)


# ---------------------------------------------------------------- what only a fake can show: calls and time


@pytest.fixture
def fake(use_gateway, settings):
    from tests.fakes import FakeGateway

    gateway = use_gateway(FakeGateway())
    settings.SLURM_SUBMIT_AS_USER = False  # no Unix accounts needed for the fake
    return gateway


def test_a_round_of_repeats_looks_their_tags_up_in_one_call_not_one_per_job(world, inventory, drains, fake):
    from tests.fakes import queue_entry

    jobs = [_submit(world, f"r-{i}") for i in range(3)]
    # claimed once before by a run that died: one of them had reached Slurm
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(relay_attempts=1)
    fake.queue_entries.append(queue_entry(4242, "PENDING", jobs[0].slurm_tag))
    result = job_relay_drain_run()
    assert (result["adopted"], result["submitted"]) == (1, 2)
    assert (fake.calls["find_by_comments"], fake.calls["find_by_comment"], fake.calls["submit"]) == (1, 0, 2)
    assert Job.objects.get(pk=jobs[0].pk).slurm_job_id == 4242


def test_no_sbatch_starts_that_could_outlive_the_claims_lease(world, inventory, drains, fake, monkeypatch, settings):
    from jobs.services import job_relay_batch_run, relay
    from portal.slurm import SlurmUnavailable

    settings.SLURM_TIMEOUT = 15
    monkeypatch.setattr(relay, "relay_lease_seconds", lambda: 10)  # shorter than one Slurm call: nothing fits
    jobs = [_submit(world, f"t-{i}") for i in range(3)]
    with pytest.raises(SlurmUnavailable, match="time budget"):
        job_relay_batch_run([str(j.pk) for j in jobs])
    with pytest.raises(SlurmUnavailable, match="lease"):
        job_relay_drain_run()
    assert fake.calls["submit"] == 0
    rows = Job.objects.filter(pk__in=[j.pk for j in jobs])
    assert {(r.state, r.relay_token, r.last_relay_error) for r in rows} == {(JobState.ACCEPTED, None, "Relay time budget spent")}


def test_a_lingering_drain_waits_for_a_fuller_round_after_a_small_one(world, inventory, drains, fake, monkeypatch):
    """Under a stream of single submits (a worker's drain, linger > 0) a round of fewer than
    RELAY_DRAIN_GATHER_BELOW jobs is followed by a RELAY_DRAIN_GATHER_SECONDS pause, so that the next
    round carries the jobs that arrived meanwhile; a full round goes straight on."""
    from jobs.services import relay

    sleeps: list[float] = []
    monkeypatch.setattr(relay.time, "sleep", sleeps.append)
    monkeypatch.setattr(relay, "RELAY_DRAIN_GATHER_SECONDS", 0.0123)  # told apart from the linger's polls
    for i in range(3):
        _submit(world, f"g-{i}")
    result = job_relay_drain_run(linger=0.001, limit=2)  # rounds of 2 then 1: both small
    assert result["submitted"] == 3 and fake.calls["submit"] == 3
    assert sleeps.count(0.0123) == 2
    sleeps.clear()
    monkeypatch.setattr(relay, "RELAY_DRAIN_GATHER_BELOW", 2)
    for i in range(3):
        _submit(world, f"h-{i}")
    job_relay_drain_run(linger=0.001, limit=2)  # a full round of 2, then a small one of 1
    assert sleeps.count(0.0123) == 1
    sleeps.clear()
    _submit(world, "eager")
    job_relay_drain_run()  # eager (tests, no linger): never waits
    assert sleeps == []
