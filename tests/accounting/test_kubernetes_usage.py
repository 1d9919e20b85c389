"""Quotas and usage on a Kubernetes cluster (issue 41 item 3), through the same services as Slurm's:
the team's cap on GPUs at once mirrored to its namespace (what a namespace can hold of the limits:
``KubernetesGateway.association_limits_held``), and the cluster's usage ingested as sacct's is —
records read from its Jobs and pods, a record whose Job went closed once. In-memory doubles of the
Kubernetes gateway here (FakeGateway subclasses); tests/k8s/test_kubernetes_quotas.py proves it on
the real control plane."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

import pytest
from django.utils import timezone

from accounting import services
from accounting.models import BudgetHold, UsageRecord
from accounting.services.ingestion import usage_ingest
from portal.models import TeamClusterAccount
from portal.services import cluster_row, clusters_record
from portal.slurm import AssociationLimits, ClusterConfig
from portal.slurm.kubernetes import KubernetesGateway
from portal.slurm.tags import slurm_tag
from portal.slurm.types import AccountingRecord
from tests.factories import QuotaFactory
from tests.fakes import FakeGateway
from tests.jobs.test_spec_kubernetes import _submit, kube_inventory  # noqa: F401 — its inventory fixture, by name

pytestmark = pytest.mark.django_db

K8S = "gpuportal-k8s"


class FakeKubernetes(FakeGateway):
    """The Kubernetes gateway's contract for limits and accounting, in memory: a namespace holds only
    the GPU cap (the real gateway's rule), and ``accounting`` by id reports a Job it no longer has as
    the real one does (CANCELLED, no submit or start time)."""

    name = "kubernetes"
    association_limits_held = KubernetesGateway.association_limits_held

    def association_limits_get(self, account):
        self._call("association_limits_get")
        return self.limits.get(account, AssociationLimits(account=account))

    def association_limits_set(self, limits):
        self._call("association_limits_set")
        self.limits[limits.account] = self.association_limits_held(limits)

    def accounting(self, start, end, *, job_ids=None):
        records = super().accounting(start, end, job_ids=job_ids)
        if job_ids is None:
            return records
        known = {r.job_id for r in self.records}
        gone = [AccountingRecord(job_id=n, name="", user="", account="", partition="kubernetes", state="CANCELLED",
                                 exit_code=None, submit_time=None, start_time=None, end_time=timezone.now(),
                                 elapsed_seconds=0, time_limit_minutes=None, num_nodes=1, nodes="", alloc_tres={},
                                 req_tres={}, comment="") for n in job_ids if n not in known]  # fmt: skip
        return [r for r in records if r.state not in ("PENDING", "RUNNING")] + gone


class PerCluster(FakeGateway):
    """use_gateway's per-cluster double: the default cluster's fake, and the Kubernetes one's."""

    def __init__(self, default, kube):
        super().__init__()
        self.clusters = {"main": default, K8S: kube}


@pytest.fixture
def two_schedulers(settings, world, use_gateway):
    settings.GPUPORTAL_CLUSTERS = (ClusterConfig("main", "cli"),
                                   ClusterConfig(K8S, "kubernetes", kind="kubernetes", kubeconfig="/nonexistent"))  # fmt: skip
    clusters_record()
    TeamClusterAccount.objects.create(team=world.vision, cluster=cluster_row(K8S), slurm_account="vision-ns")
    slurm, kube = FakeGateway(), FakeKubernetes()
    for account in ("vision", "nlp"):
        slurm.account_add(account)
    use_gateway(PerCluster(slurm, kube))
    return slurm, kube


def test_the_teams_gpu_cap_is_mirrored_to_its_namespace_and_drift_is_reported_and_mended(world, two_schedulers):
    slurm, kube = two_schedulers
    QuotaFactory(team=world.vision, gpu_hours=100, max_gpus=3)
    QuotaFactory(team=world.vision, gpu_hours=20, gpu_type="h100", max_gpus=2)  # a per-type cap: Slurm only

    services.quota_limits_apply()

    assert kube.limits["vision-ns"] == AssociationLimits(account="vision-ns", grp_tres={"gres/gpu": 3})
    assert slurm.limits["vision"].grp_tres == {"gres/gpu": 3, "gres/gpu:h100": 2}  # the Slurm path unchanged
    assert "nlp-ns" not in kube.limits  # nlp has no namespace there
    assert services.quota_limit_drift() == []

    # someone edits the namespace's quota by hand: the drift report says so, the mirror mends it
    kube.limits["vision-ns"] = AssociationLimits(account="vision-ns", grp_tres={"gres/gpu": 8})
    drift = (f"quota limits of namespace vision-ns on {K8S}: ResourceQuota requests.nvidia.com/gpu is 8 in Kubernetes, "
             "the portal expects 3")
    assert services.quota_limit_drift() == [drift]
    assert services.quota_limits_apply() == [f"fixed: {drift}"]
    assert kube.limits["vision-ns"].grp_tres == {"gres/gpu": 3}
    assert services.quota_limit_drift() == []


def _kube_record(job_uuid, *, start, end=None, state="RUNNING", gpus=2, now=None) -> AccountingRecord:
    number = int(job_uuid.hex[:13], 16)
    elapsed = int(((end or now) - start).total_seconds())
    tres = {"gres/gpu": gpus, "gres/gpu:h100": gpus}
    return AccountingRecord(
        job_id=number, name="train", user="alice", account="vision-ns", partition="kubernetes", state=state,
        exit_code=None if state == "RUNNING" else 0, submit_time=start - dt.timedelta(seconds=5), start_time=start,
        end_time=end, elapsed_seconds=elapsed, time_limit_minutes=60, num_nodes=1, nodes="k8s-h100-01",
        alloc_tres=tres, req_tres=tres, comment=slurm_tag(job_uuid),
    )  # fmt: skip


def test_a_kubernetes_jobs_usage_is_one_record_closed_at_its_last_reading_when_its_job_is_deleted(world, two_schedulers):
    _, kube = two_schedulers
    job_uuid = uuid.uuid4()
    BudgetHold.objects.create(job_uuid=job_uuid, team=world.vision, gpu_type="h100", estimated_gpu_hours=2, held_gpu_hours=2,
                              created_at=timezone.now() - dt.timedelta(minutes=11))
    started = timezone.now() - dt.timedelta(minutes=10)
    first = started + dt.timedelta(minutes=4)
    kube.records = [_kube_record(job_uuid, start=started, now=first)]

    usage_ingest(cluster=K8S, now=first)
    usage_ingest(cluster=K8S, now=first)  # the same reading again: nothing new
    [record] = UsageRecord.objects.filter(cluster=K8S)
    assert (record.provisional, record.gpu_seconds, record.team_id, record.portal_job_uuid) == (True, 2 * 240, world.vision.pk, job_uuid)
    assert record.gpu_type == "h100" and record.account == "vision-ns"

    second = started + dt.timedelta(minutes=7)
    kube.records = [_kube_record(job_uuid, start=started, now=second)]
    usage_ingest(cluster=K8S, now=second)
    kube.records = []  # cancelled: the portal deleted the Job, its pod went with it
    usage_ingest(cluster=K8S, now=second + dt.timedelta(minutes=1))

    [record] = UsageRecord.objects.filter(cluster=K8S)
    assert (record.provisional, record.state, record.end_time) == (False, "CANCELLED", second)
    assert record.gpu_seconds == 2 * 7 * 60  # what it was seen to run, once
    assert BudgetHold.objects.get(job_uuid=job_uuid).released_at is not None
    # the next ingestion finds nothing open: no second close, no second read by id
    calls = kube.calls["accounting"]
    usage_ingest(cluster=K8S, now=second + dt.timedelta(minutes=2))
    assert kube.calls["accounting"] == calls + 1 and UsageRecord.objects.get().gpu_seconds == 2 * 7 * 60


def test_a_job_past_its_deadline_whose_pod_was_deleted_is_closed_at_the_job_controllers_verdict(world, two_schedulers):
    _, kube = two_schedulers
    job_uuid = uuid.uuid4()
    started = timezone.now() - dt.timedelta(minutes=30)
    reading = started + dt.timedelta(minutes=10)
    kube.records = [_kube_record(job_uuid, start=started, now=reading, gpus=1)]
    usage_ingest(cluster=K8S, now=reading)

    deadline = started + dt.timedelta(minutes=15)
    # the Job is still there, Failed (DeadlineExceeded), its pod deleted: no start time to read
    timed_out = dataclasses.replace(kube.records[0], state="TIMEOUT", start_time=None, end_time=deadline, alloc_tres={},
                                    elapsed_seconds=0)  # fmt: skip
    kube.records = [timed_out]
    usage_ingest(cluster=K8S, now=deadline + dt.timedelta(minutes=5))

    [record] = UsageRecord.objects.filter(cluster=K8S)
    assert (record.provisional, record.state, record.end_time, record.gpu_seconds) == (False, "TIMEOUT", deadline, 15 * 60)


def test_the_beat_ingests_a_kubernetes_clusters_usage_but_reads_no_sreport_there(settings):
    from portal.project.celery import _beat_schedule

    settings.GPUPORTAL_CLUSTERS = (ClusterConfig("main"), ClusterConfig(K8S, "kubernetes", kind="kubernetes"))
    schedule = _beat_schedule()
    assert schedule[f"usage-ingest@{K8S}"]["kwargs"] == {"cluster": K8S}
    assert f"accounting-rollup@{K8S}" not in schedule


def test_the_usage_is_reconciled_job_by_job_with_the_jobs_the_api_holds(world, two_schedulers):
    _, kube = two_schedulers
    ran, unseen = uuid.uuid4(), uuid.uuid4()
    started = timezone.now() - dt.timedelta(minutes=30)
    ended = started + dt.timedelta(minutes=5)
    kube.records = [_kube_record(ran, start=started, end=ended, state="COMPLETED")]
    usage_ingest(cluster=K8S, now=ended + dt.timedelta(minutes=1))
    since = started - dt.timedelta(hours=1)
    assert services.kubernetes_usage_reconcile(cluster=K8S, since=since) == []

    UsageRecord.objects.filter(cluster=K8S).update(gpu_seconds=1)  # the portal's record disagrees with the API
    kube.records.append(_kube_record(unseen, start=started, end=ended, state="FAILED", gpus=1))  # never ingested
    number = kube.records[0].job_id
    assert services.kubernetes_usage_reconcile(cluster=K8S, since=since) == [
        f"{K8S}: job {number} in namespace vision-ns: 600 GPU-seconds in Kubernetes, 1 in the portal",
        f"{K8S}: job {kube.records[1].job_id} in namespace vision-ns: 300 GPU-seconds in Kubernetes, no usage record in the portal",
    ]


@pytest.mark.usefixtures("kube_inventory")
def test_the_gpu_hour_budget_and_its_hold_are_the_portals_own_on_kubernetes_too(world, relays):
    """The submission's budget check and hold (accounting.services.budget, inside job_submit) run for
    a job on the Kubernetes cluster as for Slurm: over the budget a 409, within it a hold."""
    QuotaFactory(team=world.vision, gpu_hours=2, gpu_type="h100")
    refused = _submit(world.alice, gpu_type="h100", gpus=4, time_limit_minutes=60)
    assert refused.status_code == 409 and "of 2.0 h100 GPU-h left" in refused.json()["detail"]
    accepted = _submit(world.alice, gpu_type="h100", gpus=1, time_limit_minutes=60)
    assert accepted.status_code == 201, accepted.json()
    hold = BudgetHold.objects.get(job_uuid=accepted.json()["id"])
    assert (hold.team_id, hold.gpu_type, hold.held_gpu_hours) == (world.vision.pk, "h100", 1)


def test_a_namespace_the_portal_may_not_read_is_reported_and_the_other_teams_are_mirrored(world, two_schedulers):
    from portal.slurm import NotPermitted

    slurm, kube = two_schedulers
    TeamClusterAccount.objects.create(team=world.nlp, cluster=cluster_row(K8S), slurm_account="nlp-ns")
    QuotaFactory(team=world.vision, gpu_hours=100, max_gpus=3)
    QuotaFactory(team=world.nlp, gpu_hours=100, max_gpus=5)

    def forbidden(account):
        if account == "vision-ns":
            raise NotPermitted("list resourcequotas: 403 forbidden", namespace=account)  # its RoleBinding missing
        return kube.limits.get(account, AssociationLimits(account=account))

    kube.association_limits_get = forbidden
    drift = services.quota_limit_drift()
    assert f"quota limits of namespace vision-ns on {K8S}: cannot be read: list resourcequotas: 403 forbidden" in drift
    services.quota_limits_apply()
    assert kube.limits["nlp-ns"].grp_tres == {"gres/gpu": 5}
