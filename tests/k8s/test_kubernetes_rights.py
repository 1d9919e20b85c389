"""The portal's own rights on the Kubernetes cluster (issue 41), against the real API server's RBAC and
admission:

- a denial of the portal's service account where its RBAC should grant the right (an API server whose
  RBAC caches are not synced yet after a start; a namespace whose RoleBinding is missing) is
  "unavailable, retry later" — the job stays ACCEPTED, never SUBMIT_FAILED, and is relayed once the
  right is back, exactly once (Jobs counted by label); the other namespaces' jobs of the same relay
  round go on;
- a refusal by admission (a ResourceQuota on the number of Jobs: 403 "exceeded quota") is a refusal;
- finished Jobs are deleted by the jobs sync once the portal has their final usage, in bulk, after
  GPUPORTAL_K8S_FINISHED_JOB_TTL_SECONDS; a namespace where the portal may not delete is skipped and
  the cluster's health says so."""

from __future__ import annotations

import time

import pytest
from kubernetes import client
from rest_framework.test import APIClient

from accounting.models import UsageRecord
from accounting.services.ingestion import usage_ingest
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_relay_batch_run, job_relay_run, jobs_sync
from portal.models import TeamClusterAccount
from portal.selectors import clusters_status
from portal.slurm import SlurmUnavailable
from tests.conftest import K8S_CLUSTER
from tests.support import job_payload, wait_for

pytestmark = pytest.mark.k8s

BINDING = "gpuportal-portal"  # the RoleBinding scripts/k8s namespace gives the portal in a team namespace


def _post(user, **fields) -> str:
    api = APIClient()
    api.force_authenticate(user=user)
    body = job_payload(cluster=K8S_CLUSTER, **({"script": "#!/bin/bash\ntrue\n", "gpus": 1, "cpus_per_gpu": 1,
                                                "memory_gb": 1, "time_limit_minutes": 5} | fields))  # fmt: skip
    body.pop("partition")
    response = api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def _kube_jobs(k8s_portal, namespace, job_id=None):
    selector = "gpuportal.io/managed-by=gpuportal" + (f",gpuportal.io/job={job_id}" if job_id else "")
    return client.BatchV1Api(k8s_portal).list_namespaced_job(namespace, label_selector=selector).items


def _may_create_jobs(k8s_portal, namespace) -> bool:
    """What the API server's authorizer answers the portal's service account now (SelfSubjectAccessReview)."""
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": {"namespace": namespace, "verb": "create", "group": "batch", "resource": "jobs"}}}  # fmt: skip
    return client.AuthorizationV1Api(k8s_portal).create_self_subject_access_review(review).status.allowed


def _account(world, namespace):
    TeamClusterAccount.objects.filter(team=world.vision, cluster__name=K8S_CLUSTER).update(slurm_account=namespace)


def _lease_expired(job_id):
    """As if the relay's lease on the job had run out (relay_lease_seconds(), 30 s) — not waited for here."""
    import datetime as dt

    from django.utils import timezone

    from jobs.services.relay import relay_lease_seconds

    Job.objects.filter(pk=job_id).update(relay_started_at=timezone.now() - dt.timedelta(seconds=relay_lease_seconds() + 1))


def _restore_binding(namespace, k8s_portal):
    import subprocess

    from tests.conftest import ROOT

    subprocess.run([str(ROOT / "scripts" / "k8s"), "namespace", namespace], check=True, capture_output=True, timeout=60)
    wait_for(lambda: _may_create_jobs(k8s_portal, namespace), timeout=30, what="the portal's right to be back")


def test_a_namespace_whose_rolebinding_is_missing_holds_its_job_accepted_until_the_right_is_back_then_relays_it_once(
    k8s_cluster, k8s_namespace, k8s_more_namespaces, k8s_admin, k8s_portal, world
):
    [other] = k8s_more_namespaces(1)
    rbac = client.RbacAuthorizationV1Api(k8s_admin)
    rbac.delete_namespaced_role_binding(BINDING, k8s_namespace)
    wait_for(lambda: not _may_create_jobs(k8s_portal, k8s_namespace), timeout=30, what="the portal's right to be gone")

    denied = _post(world.alice, name="denied")  # its request names vision's namespace at submission
    _account(world, other)
    fine = _post(world.alice, name="fine")
    with pytest.raises(SlurmUnavailable, match="RoleBinding"):  # one relay round with both: the denied one waits
        job_relay_batch_run([denied, fine], threads=1)

    job = Job.objects.get(pk=denied)
    assert (job.state, job.slurm_job_id, job.relay_token) == (JobState.ACCEPTED, None, None)  # not SUBMIT_FAILED
    assert f'in the namespace "{k8s_namespace}"' in job.last_relay_error and "retried" in job.last_relay_error
    assert Job.objects.get(pk=fine).state == JobState.PENDING  # another namespace's job of the round went on
    assert len(_kube_jobs(k8s_portal, other, fine)) == 1
    # backed off for one lease (it would otherwise head every oldest-first drain round), then retried
    assert job.relay_started_at is not None and job_relay_run(denied) == "not-claimed"
    _lease_expired(denied)
    with pytest.raises(SlurmUnavailable):  # retried while the right is missing: still waiting
        job_relay_run(denied)
    assert Job.objects.get(pk=denied).state == JobState.ACCEPTED

    _restore_binding(k8s_namespace, k8s_portal)
    _lease_expired(denied)
    assert job_relay_run(denied) == "submitted"
    job = Job.objects.get(pk=denied)
    assert job.state == JobState.PENDING and job.slurm_job_id is not None
    [kube_job] = _kube_jobs(k8s_portal, k8s_namespace)  # exactly one Job of the portal's there
    assert kube_job.metadata.labels["gpuportal.io/job"] == str(denied)


def test_a_create_refused_by_quota_admission_is_a_refusal_not_a_retry(k8s_cluster, k8s_namespace, k8s_admin, k8s_portal, world):
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-jobs"},
             "spec": {"hard": {"count/jobs.batch": "0"}}}  # fmt: skip
    client.CoreV1Api(k8s_admin).create_namespaced_resource_quota(k8s_namespace, quota)
    # the quota controller must have counted the namespace's Jobs (status.used) before admission enforces it
    wait_for(lambda: client.CoreV1Api(k8s_admin).read_namespaced_resource_quota("no-jobs", k8s_namespace).status.used,
             timeout=30, what="the quota's first count")  # fmt: skip
    job_id = _post(world.alice)
    assert job_relay_run(job_id) == "submit-failed"
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.SUBMIT_FAILED and "exceeded quota: no-jobs" in job.state_reason, job.state_reason
    assert _kube_jobs(k8s_portal, k8s_namespace) == []


def test_finished_jobs_are_deleted_in_bulk_once_their_usage_is_recorded_and_a_namespace_without_the_right_is_skipped(
    k8s_cluster, k8s_namespace, k8s_admin, k8s_portal, world, settings
):
    settings.GPUPORTAL_K8S_FINISHED_JOB_TTL_SECONDS = 2
    ids = [_post(world.alice, name=f"short-{i}") for i in range(2)]
    for job_id in ids:
        assert job_relay_run(job_id) == "submitted"

    def completed():
        jobs_sync(cluster=K8S_CLUSTER)
        return Job.objects.filter(pk__in=ids, state=JobState.COMPLETED).count() == 2

    wait_for(completed, timeout=60, interval=0.5, what="both jobs to complete")
    time.sleep(settings.GPUPORTAL_K8S_FINISHED_JOB_TTL_SECONDS + 1)
    # ended long enough ago, but their usage is not recorded yet: kept
    assert jobs_sync(cluster=K8S_CLUSTER).get("deleted", 0) == 0
    assert len(_kube_jobs(k8s_portal, k8s_namespace)) == 2

    usage_ingest(cluster=K8S_CLUSTER)
    records = {r.portal_job_uuid: r for r in UsageRecord.objects.filter(cluster=K8S_CLUSTER, portal_job_uuid__in=ids)}
    assert sorted(map(str, records)) == sorted(map(str, ids)) and not any(r.provisional for r in records.values())

    # the portal may not read its pods' logs there to keep them, nor delete (its RoleBinding gone): skipped, and the
    # cluster's health says so
    client.RbacAuthorizationV1Api(k8s_admin).delete_namespaced_role_binding(BINDING, k8s_namespace)
    wait_for(lambda: not _may_create_jobs(k8s_portal, k8s_namespace), timeout=30, what="the portal's right to be gone")
    stats = jobs_sync(cluster=K8S_CLUSTER)
    assert stats["deleted"] == 0 and stats["delete_skipped"][0].startswith(f"namespace {k8s_namespace}: ")
    [row] = [row for row in clusters_status() if row["name"] == K8S_CLUSTER]
    [condition] = [c for c in row["health"]["conditions"] if c["code"] == "namespaces_skipped"]
    assert f"namespace {k8s_namespace}: its finished Jobs are not deleted" in condition["message"]
    assert "RoleBinding" in condition["message"]
    assert len(_kube_jobs(k8s_portal, k8s_namespace)) == 2

    _restore_binding(k8s_namespace, k8s_portal)
    assert jobs_sync(cluster=K8S_CLUSTER)["deleted"] == 2  # one deletecollection for the namespace
    wait_for(lambda: not _kube_jobs(k8s_portal, k8s_namespace), timeout=30, what="the Jobs to be gone")
    wait_for(lambda: not client.CoreV1Api(k8s_portal).list_namespaced_pod(k8s_namespace).items, timeout=30,
             what="their pods to go with them (propagationPolicy Background)")  # fmt: skip
    [row] = [row for row in clusters_status() if row["name"] == K8S_CLUSTER]
    assert "namespaces_skipped" not in {c["code"] for c in row["health"]["conditions"]}

    # what the portal recorded stays as it was: a deleted Job is not taken for a cancelled one
    usage_ingest(cluster=K8S_CLUSTER)
    after = {r.portal_job_uuid: r for r in UsageRecord.objects.filter(cluster=K8S_CLUSTER, portal_job_uuid__in=ids)}
    assert {k: (r.state, r.gpu_seconds, r.end_time) for k, r in after.items()} == {
        k: (r.state, r.gpu_seconds, r.end_time) for k, r in records.items()
    }
    assert set(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == {JobState.COMPLETED}


def test_finished_jobs_are_kept_when_the_ttl_is_zero(k8s_cluster, k8s_namespace, k8s_portal, world, settings):
    settings.GPUPORTAL_K8S_FINISHED_JOB_TTL_SECONDS = 0
    job_id = _post(world.alice)
    assert job_relay_run(job_id) == "submitted"

    def completed():
        jobs_sync(cluster=K8S_CLUSTER)
        return Job.objects.get(pk=job_id).state == JobState.COMPLETED

    wait_for(completed, timeout=60, interval=0.5, what="the job to complete")
    usage_ingest(cluster=K8S_CLUSTER)
    time.sleep(1)
    assert "deleted" not in jobs_sync(cluster=K8S_CLUSTER)
    assert len(_kube_jobs(k8s_portal, k8s_namespace, job_id)) == 1
