"""Quotas and money on the Kubernetes cluster (issue 41 item 3), against the real control plane
(``k8s_cluster``: team vision's namespace there is this test's own):

- the team's cap on GPUs at once is its namespace's ResourceQuota ``requests.nvidia.com/gpu``, set by
  the same quota mirror as Slurm's association limits, and an edit made by hand is reported as drift
  and mended;
- ResourceQuota admission is real: a job over the cap is refused by the API server when the Job
  controller creates its pod, held (no pod), and the portal shows the quota's refusal as its reason;
- a job's usage comes from its pod's start and end × its GPUs (what the API itself says), lands once
  in the usage records with its price, and turns the job's budget hold into used GPU-hours; a
  cancelled running job (its Job deleted) is closed once, at its last reading.

The default Slurm cluster is an in-memory double here (the limits' Slurm half is tested in
tests/accounting/test_quotas_slurm.py); everything on the Kubernetes side is the real API server."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone
from kubernetes import client, config
from rest_framework.test import APIClient

from accounting import services
from accounting.models import BudgetHold, UsageRecord, UsageSlice
from accounting.services.ingestion import usage_ingest
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_cancel, job_cancel_relay_run, job_relay_run, jobs_sync
from portal.slurm import get_gateway, use_gateway
from portal.slurm.kubernetes import QUOTA_NAME
from tests.conftest import K8S_CLUSTER
from tests.factories import QuotaFactory
from tests.fakes import FakeGateway
from tests.support import job_payload, wait_for

pytestmark = pytest.mark.k8s

GPU_QUOTA = "requests.nvidia.com/gpu"


class SlurmDoubleBesideKubernetes(FakeGateway):
    """get_gateway() of the default (Slurm) cluster: this in-memory double; of gpuportal-k8s: the real
    Kubernetes gateway (use_gateway's per-cluster mapping)."""

    def __init__(self, kube):
        super().__init__()
        self.clusters = {K8S_CLUSTER: kube}
        for account in ("vision", "nlp"):
            self.account_add(account)


@pytest.fixture
def mirrored(k8s_cluster):
    """The quota mirror with the default cluster's Slurm half in memory."""
    with use_gateway(SlurmDoubleBesideKubernetes(get_gateway(K8S_CLUSTER))) as double:
        yield double


def _quota_hard(k8s_portal, namespace):
    core = client.CoreV1Api(k8s_portal)
    return {q.metadata.name: dict(q.spec.hard) for q in core.list_namespaced_resource_quota(namespace).items}


def _post(user, **fields):
    api = APIClient()
    api.force_authenticate(user=user)
    body = job_payload(cluster=K8S_CLUSTER, **fields)
    body.pop("partition")
    response = api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def _pods(k8s_portal, namespace, job_id):
    return client.CoreV1Api(k8s_portal).list_namespaced_pod(namespace, label_selector=f"gpuportal.io/job={job_id}").items


def _synced_until(job_id, predicate, *, what, timeout=60):
    def reached():
        jobs_sync(cluster=K8S_CLUSTER)
        job = Job.objects.get(pk=job_id)
        return job if predicate(job) else None

    return wait_for(reached, timeout=timeout, interval=0.5, what=what)


def test_the_teams_gpu_cap_is_its_namespaces_resource_quota_and_a_hand_edit_is_reported_and_mended(
    mirrored, k8s_namespace, k8s_portal, world
):
    quota = QuotaFactory(team=world.vision, gpu_hours=500, max_gpus=3)

    services.quota_limits_apply(teams=[world.vision])

    assert _quota_hard(k8s_portal, k8s_namespace) == {QUOTA_NAME: {GPU_QUOTA: "3"}}
    assert mirrored.limits["vision"].grp_tres == {"gres/gpu": 3}  # Slurm's association, the same path
    assert [line for line in services.quota_limit_drift() if k8s_namespace in line] == []

    # a site admin edits the namespace's quota by hand (the admin's kubeconfig, not the portal's)
    admin = config.new_client_from_config(config_file=str(Path(settings.GPUPORTAL_K8S_KUBECONFIG).with_name("admin.kubeconfig")))
    client.CoreV1Api(admin).patch_namespaced_resource_quota(QUOTA_NAME, k8s_namespace, {"spec": {"hard": {GPU_QUOTA: "8"}}})
    drift = [line for line in services.quota_limit_drift() if k8s_namespace in line]
    assert drift == [
        (f"quota limits of namespace {k8s_namespace} on {K8S_CLUSTER}: ResourceQuota requests.nvidia.com/gpu is 8 in "
         "Kubernetes, the portal expects 3")
    ]
    fixed = services.quota_limits_apply(teams=[world.vision])
    assert fixed == [f"fixed: {drift[0]}"]
    assert _quota_hard(k8s_portal, k8s_namespace) == {QUOTA_NAME: {GPU_QUOTA: "3"}}

    # the cap lifted: the namespace's quota goes
    quota.max_gpus = None
    quota.save()
    services.quota_limits_apply(teams=[world.vision])
    assert _quota_hard(k8s_portal, k8s_namespace) == {}
    assert [line for line in services.quota_limit_drift() if k8s_namespace in line] == []


def test_a_job_over_the_namespaces_gpu_cap_is_refused_by_quota_admission_and_held_with_its_reason(
    mirrored, k8s_namespace, k8s_portal, world
):
    QuotaFactory(team=world.vision, gpu_hours=500, max_gpus=2)
    services.quota_limits_apply(teams=[world.vision])
    core = client.CoreV1Api(k8s_portal)
    wait_for(lambda: core.read_namespaced_resource_quota(QUOTA_NAME, k8s_namespace).status.hard,
             what="the resource-quota controller to compute the quota's status")  # fmt: skip

    over = _post(world.alice, script="#!/bin/bash\nsleep 60\n", gpus=4, gpu_type="h100", cpus_per_gpu=1, memory_gb=1)
    assert job_relay_run(over) == "submitted"  # the Job is created: admission refuses its pod

    job = _synced_until(over, lambda j: "exceeded quota" in j.state_reason, what="the quota's refusal as the job's reason")
    assert job.state == JobState.PENDING
    assert f"requested: {GPU_QUOTA}=4" in job.state_reason and f"limited: {GPU_QUOTA}=2" in job.state_reason
    assert _pods(k8s_portal, k8s_namespace, over) == []  # held: no pod was admitted
    page = APIClient()
    page.force_login(world.alice)
    assert "exceeded quota" in page.get(f"/jobs/{over}/").content.decode()

    within = _post(world.alice, script="#!/bin/bash\necho within\n", gpus=2, gpu_type="a100", cpus_per_gpu=1, memory_gb=1)
    assert job_relay_run(within) == "submitted"
    assert _synced_until(within, lambda j: j.state in (JobState.COMPLETED, JobState.FAILED), what="the job within the cap to end").state == JobState.COMPLETED
    job_cancel(user=world.alice, job=Job.objects.get(pk=over))
    job_cancel_relay_run(over)


def test_a_jobs_usage_is_its_pods_run_times_its_gpus_once_priced_and_its_hold_is_converted(k8s_cluster, k8s_namespace, k8s_portal, world):
    job_id = _post(world.alice, script="#!/bin/bash\nsleep 2\necho done\n", gpus=2, gpu_type="h100", cpus_per_gpu=1,
                   memory_gb=1, time_limit_minutes=5)  # fmt: skip
    assert BudgetHold.objects.filter(job_uuid=job_id, released_at__isnull=True).exists()  # the same hold as on Slurm
    assert job_relay_run(job_id) == "submitted"
    _synced_until(job_id, lambda j: j.state == JobState.COMPLETED, what="the job to complete")

    usage_ingest(cluster=K8S_CLUSTER)
    written = UsageRecord.objects.get(cluster=K8S_CLUSTER, portal_job_uuid=job_id)
    usage_ingest(cluster=K8S_CLUSTER)  # read again (the managed namespaces may hold other runs' Jobs too)

    [pod] = _pods(k8s_portal, k8s_namespace, job_id)
    ran = pod.status.container_statuses[0].state.terminated  # the API's own record of the run
    [record] = UsageRecord.objects.filter(cluster=K8S_CLUSTER, portal_job_uuid=job_id)
    assert (record.start_time, record.end_time) == (ran.started_at, ran.finished_at)
    assert record.gpu_seconds == 2 * int((ran.finished_at - ran.started_at).total_seconds()) > 0
    assert (record.gpus, record.gpu_type, record.team_id, record.account, record.provisional) == (2, "h100", world.vision.pk, k8s_namespace, False)
    assert record.state == "COMPLETED" and record.job_id == Job.objects.get(pk=job_id).slurm_job_id
    assert (record.pk, record.gpu_seconds, record.known_until) == (written.pk, written.gpu_seconds, written.known_until)  # read twice, recorded once
    assert UsageSlice.objects.filter(record=record).exists()  # priced by the same rate book
    assert BudgetHold.objects.get(job_uuid=job_id).released_at is not None  # the hold became used GPU-hours
    # reconciled against the API's own records: no difference for this Job, one once the record is off
    since = Job.objects.get(pk=job_id).created_at - dt.timedelta(minutes=1)
    mine = [line for line in services.kubernetes_usage_reconcile(cluster=K8S_CLUSTER, since=since) if f"job {record.job_id} " in line]
    assert mine == []
    UsageRecord.objects.filter(pk=record.pk).update(gpu_seconds=record.gpu_seconds + 2)
    mine = [line for line in services.kubernetes_usage_reconcile(cluster=K8S_CLUSTER, since=since) if f"job {record.job_id} " in line]
    assert mine == [(f"{K8S_CLUSTER}: job {record.job_id} in namespace {k8s_namespace}: {record.gpu_seconds} GPU-seconds in "
                     f"Kubernetes, {record.gpu_seconds + 2} in the portal")]  # fmt: skip


def test_a_cancelled_running_job_is_charged_once_up_to_its_deletion_as_the_api_reports_it(k8s_cluster, k8s_namespace, k8s_portal, world):
    import time

    job_id = _post(world.alice, script="#!/bin/bash\nexec sleep 600\n", gpus=1, gpu_type="a100", cpus_per_gpu=1, memory_gb=1)
    assert job_relay_run(job_id) == "submitted"
    _synced_until(job_id, lambda j: j.state == JobState.RUNNING and j.started_at, what="the job to run")

    def read_running():
        usage_ingest(cluster=K8S_CLUSTER)
        return UsageRecord.objects.filter(cluster=K8S_CLUSTER, portal_job_uuid=job_id, gpu_seconds__gt=0).exists()

    wait_for(read_running, what="a reading of the running job with GPU-seconds", interval=1)
    running = UsageRecord.objects.get(cluster=K8S_CLUSTER, portal_job_uuid=job_id)
    assert running.provisional and running.end_time is None
    time.sleep(3)  # it runs on past its last reading

    job_cancel(user=world.alice, job=Job.objects.get(pk=job_id))
    before = timezone.now().replace(microsecond=0)  # the API's timestamps are whole seconds
    assert job_cancel_relay_run(job_id) == "sent"
    after = timezone.now()
    # recorded by the cancel itself: final, to the Job's deletionTimestamp (what the API server set)
    [record] = UsageRecord.objects.filter(cluster=K8S_CLUSTER, portal_job_uuid=job_id)
    assert (record.provisional, record.state) == (False, "CANCELLED")
    assert before <= record.end_time <= after and record.end_time >= running.known_until + dt.timedelta(seconds=2)
    assert record.gpu_seconds == int((record.end_time - record.start_time).total_seconds()) > running.gpu_seconds
    assert BudgetHold.objects.get(job_uuid=job_id).released_at is not None
    charged = (record.pk, record.end_time, record.gpu_seconds)

    wait_for(lambda: not _pods(k8s_portal, k8s_namespace, job_id), what="the Job and its pod to be gone")
    job = _synced_until(job_id, lambda j: j.state == JobState.CANCELLED, what="the portal's job to be cancelled")
    usage_ingest(cluster=K8S_CLUSTER)
    usage_ingest(cluster=K8S_CLUSTER)
    [record] = UsageRecord.objects.filter(cluster=K8S_CLUSTER, portal_job_uuid=job_id)
    assert (record.pk, record.end_time, record.gpu_seconds) == charged  # once: the ingestion changes nothing
    assert job.ended_at >= record.end_time


def test_a_job_cancelled_before_any_reading_is_charged_what_it_ran(k8s_cluster, k8s_namespace, k8s_portal, world):
    """A job that starts and is cancelled between two ingestions left no reading at all: before the
    cancel recorded what ran, it was never charged."""
    job_id = _post(world.alice, script="#!/bin/bash\nexec sleep 600\n", gpus=2, gpu_type="a100", cpus_per_gpu=1, memory_gb=1)
    assert job_relay_run(job_id) == "submitted"
    _synced_until(job_id, lambda j: j.state == JobState.RUNNING and j.started_at, what="the job to run")
    [pod] = _pods(k8s_portal, k8s_namespace, job_id)
    started = pod.status.container_statuses[0].state.running.started_at
    assert not UsageRecord.objects.filter(portal_job_uuid=job_id).exists()

    job_cancel(user=world.alice, job=Job.objects.get(pk=job_id))
    assert job_cancel_relay_run(job_id) == "sent"
    [record] = UsageRecord.objects.filter(cluster=K8S_CLUSTER, portal_job_uuid=job_id)
    assert (record.start_time, record.state, record.provisional, record.gpus) == (started, "CANCELLED", False, 2)
    assert record.gpu_seconds == 2 * int((record.end_time - started).total_seconds())


def test_reconcile_usage_for_the_kubernetes_cluster_compares_its_jobs_with_the_usage_records(
    k8s_cluster, k8s_namespace, k8s_portal, world
):
    """``manage.py reconcile_usage --cluster gpuportal-k8s``: the ended Jobs the API holds against the
    portal's records — none for a job recorded as it ran, a DIFFERENCE line (exit 1) once its record is off."""
    import io

    from django.core.management import call_command

    from accounting.calendar import billing_zone

    job_id = _post(world.alice, script="#!/bin/bash\nsleep 1\n", gpus=1, gpu_type="a100", cpus_per_gpu=1, memory_gb=1,
                   time_limit_minutes=5)  # fmt: skip
    assert job_relay_run(job_id) == "submitted"
    _synced_until(job_id, lambda j: j.state == JobState.COMPLETED, what="the job to complete")
    usage_ingest(cluster=K8S_CLUSTER)
    record = UsageRecord.objects.get(cluster=K8S_CLUSTER, portal_job_uuid=job_id)
    month = timezone.localtime(record.submit_time, billing_zone())  # the billing month it falls in

    def reconcile() -> tuple[int, list[str]]:
        out = io.StringIO()
        try:
            call_command("reconcile_usage", "--month", f"{month:%Y-%m}", "--cluster", K8S_CLUSTER, stdout=out)
            code = 0
        except SystemExit as exc:
            code = exc.code
        lines = out.getvalue().splitlines()
        assert f"{month:%Y-%m} {K8S_CLUSTER}: the ended Jobs the Kubernetes API holds against their usage records" in lines
        return code, [line for line in lines if f"job {record.job_id} " in line]

    code, mine = reconcile()
    assert mine == []  # (other runs' Jobs in other managed namespaces may differ: only this one is asserted)
    UsageRecord.objects.filter(pk=record.pk).update(gpu_seconds=record.gpu_seconds + 5)
    code, mine = reconcile()
    assert code == 1
    assert mine == [f"DIFFERENCE {K8S_CLUSTER}: job {record.job_id} in namespace {k8s_namespace}: {record.gpu_seconds} "
                    f"GPU-seconds in Kubernetes, {record.gpu_seconds + 5} in the portal"]  # fmt: skip
