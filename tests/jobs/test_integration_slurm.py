"""End to end against the real local cluster (scripts/cluster up) and, where marked, a real Celery
worker: API submit → relay → Slurm → sync → output; cancel; validation never reaches Slurm; the
relay is exactly once; the sync makes one squeue (and at most one sacct) per cycle. The job flow
runs for every ``slurm_target``: cli on Slurm 22.05 and 25.11, pyslurm on 25.11."""

from __future__ import annotations

import os
import re
import time

import pytest
from django.conf import settings
from django.utils import timezone
from rest_framework.test import APIClient

from jobs import services
from jobs.choices import TERMINAL_STATES, JobState
from jobs.models import Job
from jobs.services import job_relay_run, job_submit, jobs_sync
from portal.slurm import get_gateway
from tests.support import job_payload, relay_crashed_after_sbatch, slurm_command, slurm_tags, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]

GPU_SCRIPT = '#!/bin/bash\necho "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES on $(hostname)"\n'


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user=user)
    return client


def sync_until(predicate, *, timeout=60.0):
    """Run sync cycles until predicate() holds."""

    def step():
        jobs_sync()
        return predicate()

    return wait_for(step, timeout=timeout, interval=0.3)


def slurm_id_of(job_id) -> int | None:
    return Job.objects.filter(pk=job_id).values_list("slurm_job_id", flat=True).first()


@pytest.mark.celery
def test_api_submit_reaches_slurm_runs_and_shows_gpu_output(slurm_target, real_worker, cluster):
    client = client_for(cluster.alice)
    latencies = []
    ids = []
    for i in range(3):
        started = time.monotonic()
        response = client.post("/api/v1/jobs/", job_payload(name=f"e2e-{i}", script=GPU_SCRIPT, gpus=1, time_limit_minutes=5), format="json")
        assert response.status_code == 201, response.json()
        job_id = response.json()["id"]
        wait_for(lambda: slurm_id_of(job_id), timeout=60, interval=0.05)
        latencies.append(time.monotonic() - started)
        ids.append(job_id)
    print(f"\nAPI submit → Slurm id: {', '.join(f'{s * 1000:.0f} ms' for s in latencies)}")

    sync_until(lambda: all(s == JobState.COMPLETED for s in Job.objects.filter(pk__in=ids).values_list("state", flat=True)))
    job = Job.objects.get(pk=ids[0])
    assert job.exit_code == 0 and job.started_at and job.ended_at
    detail = client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert [e["state"] for e in detail["events"]][:2] == ["ACCEPTED", "PENDING"] and detail["events"][-1]["state"] == "COMPLETED"
    output = wait_for(lambda: client.get(f"/api/v1/jobs/{job.pk}/output/").json()["data"], timeout=10)
    # Slurm sets the index of the GPU it allocated on the node (0–3 here; another job may hold 0)
    assert re.search(r"^CUDA_VISIBLE_DEVICES=[0-3] on ", output, re.M), output


@pytest.mark.celery
def test_cancel_of_a_running_job_cancels_it_in_slurm_and_in_the_portal(slurm_target, real_worker, cluster):
    client = client_for(cluster.alice)
    response = client.post("/api/v1/jobs/", job_payload(name="sleeper", script="#!/bin/bash\nsleep 300\n", gpus=1), format="json")
    job_id = response.json()["id"]
    slurm_id = wait_for(lambda: slurm_id_of(job_id), timeout=60, interval=0.1)
    sync_until(lambda: Job.objects.get(pk=job_id).state == JobState.RUNNING)

    response = client.post(f"/api/v1/jobs/{job_id}/cancel/")
    assert response.status_code == 202 and response.json()["cancel_requested"] is True

    def slurm_state():
        entry = next((e for e in get_gateway().queue() if e.job_id == slurm_id), None)
        return entry.state if entry else None

    assert wait_for(lambda: slurm_state() == "CANCELLED" or None, timeout=60)
    sync_until(lambda: Job.objects.get(pk=job_id).state == JobState.CANCELLED)
    assert client.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 409


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"partition": "nosuchpartition"}, "partition"),
        ({"partition": "debug", "time_limit_minutes": 61}, "time_limit_minutes"),
        ({"gpus": 5}, "gpus"),
        ({"script": ""}, "script"),
    ],
)
def test_invalid_submission_is_400_and_nothing_reaches_slurm(cluster, overrides, field, django_capture_on_commit_callbacks):
    # only the world's accounts: a benchmark or another run submitting to the same cluster meanwhile
    # (its own account) is not this request reaching Slurm
    accounts = {cluster.vision.slurm_account, cluster.nlp.slurm_account}
    before = slurm_tags(accounts=accounts)
    with django_capture_on_commit_callbacks(execute=True):
        response = client_for(cluster.alice).post("/api/v1/jobs/", job_payload(**overrides), format="json")
    assert response.status_code == 400 and field in response.json()["errors"]
    assert Job.objects.count() == 0
    assert {t for t in slurm_tags(accounts=accounts) - before if t.startswith("gpuportal:")} == set()


def test_another_teams_job_is_404(cluster, django_capture_on_commit_callbacks, settings):
    with django_capture_on_commit_callbacks(execute=True):  # eager relay: really submitted
        response = client_for(cluster.alice).post("/api/v1/jobs/", job_payload(script=GPU_SCRIPT, gpus=1), format="json")
    job_id = response.json()["id"]
    assert slurm_id_of(job_id) is not None
    carol = client_for(cluster.carol)
    assert carol.get(f"/api/v1/jobs/{job_id}/").status_code == 404
    assert carol.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 404
    assert carol.get(f"/api/v1/jobs/{job_id}/output/").status_code == 404


def test_a_job_killed_by_a_signal_shows_the_signal_sacct_gives(slurm_target, cluster, client):
    """sacct's ExitCode is "code:signal": a batch shell that kills itself with SIGKILL ends "0:9", one
    that exits 3 ends "3:0". The portal records both halves as sacct gives them and shows the signal
    on the job's page, in the API and in the task table's place of the exit code."""
    scripts = {"killed": "#!/bin/bash\nkill -9 $$\n", "exits": "#!/bin/bash\nexit 3\n"}
    jobs = {}
    for name, script in scripts.items():
        jobs[name], _ = job_submit(user=cluster.alice, team=cluster.vision, name=name, script=script, partition="gpu",
                                   gpu_type="a100", gpus=1, time_limit_minutes=2)  # fmt: skip
        assert job_relay_run(jobs[name].pk) == "submitted"
    ids = [job.pk for job in jobs.values()]
    sync_until(lambda: Job.objects.filter(pk__in=ids, exit_code__isnull=False).count() == 2)  # accounting's verdict
    by_name = {job.name: job for job in Job.objects.filter(pk__in=ids)}
    for name, job in by_name.items():
        oracle = slurm_command("sacct", "-X", "-n", "-P", "-o", "ExitCode", "-j", str(job.slurm_job_id)).stdout.strip()
        assert f"{job.exit_code}:{job.exit_signal}" == oracle, (name, oracle)
    assert (by_name["killed"].state, by_name["killed"].exit_code, by_name["killed"].exit_signal) == (JobState.FAILED, 0, 9)
    assert (by_name["exits"].exit_code, by_name["exits"].exit_signal) == (3, 0)
    api = client_for(cluster.alice).get(f"/api/v1/jobs/{by_name['killed'].pk}/").json()
    assert (api["exit_code"], api["exit_signal"], api["exit_signal_text"]) == (0, 9, "signal 9 (SIGKILL)")
    client.force_login(cluster.alice)
    page = client.get(f"/jobs/{by_name['killed'].pk}/").content.decode()
    assert "exit code <code>0</code> · signal 9 (SIGKILL)" in page
    assert "signal" not in client.get(f"/jobs/{by_name['exits'].pk}/").content.decode().split('id="job-status"')[1].split("</p>")[0]


@pytest.fixture
def root_only_directory():
    """A directory every user can enter and only root can write (the node is this host)."""
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="gpuportal-root-only-", dir="/var/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_job_whose_output_its_user_cannot_write_is_explained(slurm_target, cluster, root_only_directory):
    """A directory its Unix user cannot write: Slurm fails the job before the script runs and sacct
    gives 0:53 (slurmd's ESLURMD_IO_ERROR); the portal says what that means instead of "exit code 0"."""
    unwritable = root_only_directory
    job, _ = job_submit(user=cluster.alice, team=cluster.vision, name="no-output", script="#!/bin/bash\necho hi\n",
                        partition="gpu", gpu_type="a100", gpus=1, time_limit_minutes=2, workdir=str(unwritable))  # fmt: skip
    assert job_relay_run(job.pk) == "submitted"
    sync_until(lambda: Job.objects.filter(pk=job.pk, exit_code__isnull=False).exists())
    job.refresh_from_db()
    oracle = slurm_command("sacct", "-X", "-n", "-P", "-o", "ExitCode", "-j", str(job.slurm_job_id)).stdout.strip()
    assert (job.state, f"{job.exit_code}:{job.exit_signal}", oracle) == (JobState.FAILED, "0:53", "0:53")
    api = client_for(cluster.alice).get(f"/api/v1/jobs/{job.pk}/").json()
    assert api["exit_signal_text"].startswith("signal 53: Slurm could not open the job's output or error file")
    output = client_for(cluster.alice).get(f"/api/v1/jobs/{job.pk}/output/").json()
    assert output["data"] == "" and output["message"].endswith(api["exit_signal_text"]), output


def test_relay_after_a_crash_following_sbatch_leaves_exactly_one_slurm_job(slurm_target, cluster):
    job, _ = job_submit(
        user=cluster.alice, team=cluster.vision, name="once", script="#!/bin/bash\nsleep 30\n", partition="gpu",
        gpu_type="a100", gpus=1, time_limit_minutes=5,
    )  # fmt: skip
    first_id = relay_crashed_after_sbatch(job)  # it claimed the job (attempt 1), sbatch succeeded, it died before the write

    outcomes = [job_relay_run(job.pk), job_relay_run(job.pk)]  # the sweeper's retry, and a duplicate
    assert outcomes == ["adopted", "not-claimed"]
    carrying = [e.job_id for e in get_gateway().queue() if e.comment == job.slurm_tag]
    assert carrying == [first_id]
    job.refresh_from_db()
    assert (job.slurm_job_id, job.state) == (first_id, JobState.PENDING)
    get_gateway().cancel(first_id)


def _submit_direct(world, n: int) -> list[Job]:
    """n small jobs: Job rows, each really in Slurm with its tag (bypassing the relay for speed)."""
    jobs = []
    for i in range(n):
        job, _ = job_submit(
            user=world.alice, team=world.vision, name=f"sync-{i}", script="#!/bin/bash\ntrue\n", partition="debug",
            gpus=1, time_limit_minutes=1,
        )  # fmt: skip
        jobs.append(job)
    gateway = get_gateway()
    now = timezone.now()
    for job in Job.objects.select_related("team", "submitter__profile").filter(pk__in=[j.pk for j in jobs]):
        slurm_id = gateway.submit(services._submission_for(job))
        Job.objects.filter(pk=job.pk).update(slurm_job_id=slurm_id, slurm_cluster=settings.SLURM_CLUSTER,
                                             state=JobState.PENDING, submitted_at=now)  # fmt: skip
    return jobs


@pytest.mark.parametrize("n", [1, 50])
def test_sync_makes_one_squeue_and_at_most_one_sacct_per_cycle(slurm_target, cluster, counting_gateway,
                                                                django_assert_max_num_queries, n):
    jobs = _submit_direct(cluster, n)
    counting_gateway.calls.clear()  # the submissions went through the gateway too: count the sync cycles only
    ids = [j.pk for j in jobs]
    durations = []

    def cycle() -> bool:
        """One sync cycle (what beat runs): its Slurm calls and queries checked; True once all ended."""
        before = dict(counting_gateway.calls)
        # at most 15, whatever n: the live jobs; their rows locked and re-read, updated, their events;
        # the holds of the jobs that ended released and the team's totals (select, update each);
        # the holds' Slurm ids (issue 33: usage matched by cluster and id); the sync's status row
        # (created with a savepoint the first time); the savepoints around the writes
        with django_assert_max_num_queries(15):
            stats = jobs_sync()
        durations.append(stats["duration_ms"])
        assert counting_gateway.calls["queue"] - before.get("queue", 0) == 1
        assert counting_gateway.calls["accounting"] - before.get("accounting", 0) <= 1
        assert set(counting_gateway.calls) <= {"queue", "accounting"}
        return set(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) <= TERMINAL_STATES

    wait_for(cycle, timeout=90, interval=0.5, what=f"the {n} jobs to end")
    states = set(Job.objects.filter(pk__in=ids).values_list("state", flat=True))
    assert states == {JobState.COMPLETED}, states
    print(f"\nsync of {n} jobs: {len(durations)} cycles, durations {durations} ms")
    # history: no job went backwards (events in order of progress)
    from jobs.models import JobEvent

    for job_id in ids[:5]:
        seen = list(JobEvent.objects.filter(job_id=job_id).order_by("at", "pk").values_list("state", flat=True))
        assert seen[0] == JobState.ACCEPTED and seen[-1] == JobState.COMPLETED
        assert len(seen) == len(set(seen))
