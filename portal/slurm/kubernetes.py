"""The Kubernetes backend (issue 41): a configured cluster of kind ``kubernetes`` behind the one gateway
interface, so the relay, the sync, the cancel and the inventory sync treat it as they treat a Slurm
cluster, through the official ``kubernetes`` client and the portal's service account (its rights:
scripts/lib/k8s-bootstrap.py — namespaced in the teams' namespaces; cluster-wide, read only: nodes,
namespaces, and the lists of Jobs, pods and events the sync makes).

- ``submit``: the stored request as a ``batch/v1`` Job (``kube_job.job_manifest``) in the team's
  namespace; a retried create answered 409 AlreadyExists is the same Job (named after the portal's
  job), never a second one. The id returned is ``kube_job.job_number`` of the job's uuid. An array
  with a ``%N`` limit: the first N tasks' Jobs; ``array_tasks_start`` creates the next ones (the sync's).
- ``queue`` / ``accounting``: the portal's Jobs and their pods, ONE cluster-scoped list of each (by
  label) whatever the number of jobs and namespaces, kept to the managed namespaces (label
  ``gpuportal.io/managed=true``: one list), and ONE list of Warning events when a job waits (the
  scheduler's "0/2 nodes are available: …", the quota's "exceeded quota: …"): Slurm's states in
  Slurm's words. Kubernetes keeps no accounting: an ended Job is its own record, and a Job the API no
  longer has (the portal's cancel deletes it) is reported CANCELLED when asked for by id. Without ids
  (the usage ingestion, as ``sacct -S -E``): every Job of the window, a running one's figures so far.
- ``find_by_comments`` (a relay claimed again): ONE list of Jobs by the tags' job uuids (their label).
- ``cancel``: delete the Job with ``propagationPolicy=Foreground`` (its pod goes with it), and
  return what a running one ran up to the deletion the API server reports (the portal records it);
  ``jobs_delete``: finished Jobs, in bulk (the sync's, once their usage is recorded and their pods'
  logs kept: ``job_logs``).
- errors: an RBAC denial of the portal's own account is ``NotPermitted`` (unavailable: retried), a
  refusal by the API server's admission (a quota, a webhook) ``SlurmRejected`` (``_call``).
- the inventory: the GPU nodes (type from ``gpu_type_label``, GPUs from ``allocatable``) in one
  partition named after the backend, so the submission's checks (GPU types, counts, time) run on it
  as on a Slurm partition; ``version`` is the API server's (/version: "v1.20.2").
- what only Slurm has (reservations, associations, sreport) is refused or empty: the portal never
  asks a Kubernetes cluster for it (portal.slurm.slurm_clusters).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import re
import threading
from collections.abc import Collection

from . import kube_job as kj
from . import types as t
from .base import SlurmGateway

logger = logging.getLogger(__name__)
PARTITION = "kubernetes"  # the one partition a Kubernetes cluster's inventory has
MANAGED_NAMESPACES = "gpuportal.io/managed=true"
QUOTA_NAME = "gpuportal-gpus"  # the ResourceQuota that mirrors a team's cap on GPUs at once
QUOTA_RESOURCE = f"requests.{kj.GPU_RESOURCE}"
DELETE_BATCH = 100  # job numbers in one deletecollection's label selector (16 digits each: ~1.8 KB of URL)
# The authorizer's 403 (k8s.io/apiserver's forbidden message: `User "…" cannot VERB resource "R" in API
# group "G" in the namespace "N"`, or "at the cluster scope", or "cannot get path"), not an admission
# plugin's ("exceeded quota: …", a webhook's): the first is a right missing, the second a refusal.
_AUTHORIZER_DENIAL = re.compile(r'User "[^"]*" cannot \S+ (?:resource|path) ')
_DENIED_IN = re.compile(r' in the namespace "([^"]*)"')


class KubernetesGateway(SlurmGateway):
    name = "kubernetes"

    def __init__(self, *, cluster: str, kubeconfig: str, timeout: int, image: str, gpu_type_label: str):
        self.cluster = cluster
        self.kubeconfig = kubeconfig
        self.timeout = timeout
        self.image = image
        self.gpu_type_label = gpu_type_label
        self._client = None
        self._lock = threading.Lock()

    # -- the client -------------------------------------------------------------------------------

    def _api(self, kind: str):
        from kubernetes import client, config

        with self._lock:
            if self._client is None:
                if not self.kubeconfig:
                    raise t.SlurmUnavailable(f"cluster {self.cluster}: no kubeconfig (GPUPORTAL_K8S_KUBECONFIG)")
                try:
                    self._client = config.new_client_from_config(config_file=self.kubeconfig)
                except (OSError, config.ConfigException) as exc:
                    raise t.SlurmUnavailable(f"cluster {self.cluster}: kubeconfig {self.kubeconfig}: {exc}") from None
        return getattr(client, kind)(self._client)

    def _call(self, what: str, function, *args, **kwargs):
        """One API call; its errors as the gateway's: 404/409 raised as ApiException for the caller
        that expects them; a 403 of the authorizer (RBAC: "User … cannot VERB resource …") NotPermitted
        — the portal asks only for what its service account is granted, so the grant is not in force
        yet (an API server starting, its RBAC caches not synced; a namespace's RoleBinding missing):
        retried, as SlurmUnavailable is; other 4xx SlurmRejected (the API server's message: an
        admission plugin's refusal, e.g. ResourceQuota's 403 "exceeded quota" on a create it counts,
        is a refusal); 5xx, 429 and no answer SlurmUnavailable."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return function(*args, _request_timeout=self.timeout, **kwargs)
        except ApiException as exc:
            if exc.status in (404, 409):
                raise
            text = _message(exc)
            message = f"{what}: {exc.status} {text}"
            if exc.status == 403 and _AUTHORIZER_DENIAL.search(text):
                namespace = found.group(1) if (found := _DENIED_IN.search(text)) else ""
                where, binding = (f"in namespace {namespace}", "its RoleBinding there") if namespace else (
                    "cluster-wide", "its ClusterRoleBinding")  # fmt: skip
                raise t.NotPermitted(f"{message} (the portal's service account lacks this right {where} now: RBAC not "
                                     f"synced yet after an API server start, or {binding} missing; retried)",
                                     command=what, namespace=namespace) from None  # fmt: skip
            if exc.status == 429 or exc.status >= 500:
                raise t.SlurmUnavailable(message, command=what) from None
            raise t.SlurmRejected(message, command=what) from None
        except (HTTPError, OSError) as exc:
            raise t.SlurmUnavailable(f"{what}: {exc}", command=what) from None

    def version(self) -> str:
        return self._call("version", self._api("VersionApi").get_code).git_version

    def ping(self) -> bool:
        return bool(self.version())

    # -- jobs -------------------------------------------------------------------------------------

    def submit(self, submission: t.JobSubmission) -> int:
        """Create the job's Job — an array's: one per task, in index order; with a ``%N`` limit only
        the first N (the sync creates the others as earlier ones end: array_tasks_start)."""
        namespace, bodies = kj.job_manifests(submission, image=self.image, gpu_type_label=self.gpu_type_label)
        number = int(bodies[0]["metadata"]["labels"][kj.LABEL_NUMBER])
        limit = kj.array_limit(dict(submission.request.options).get("array") or "")
        self._jobs_create(namespace, bodies[:limit] if limit else bodies)
        return number

    def array_tasks_start(self, submission: t.JobSubmission, indexes: Collection[int]) -> None:
        """Create these tasks' Jobs of an array submitted earlier (the sync's, under its ``%N`` limit),
        through submit's create: a task whose Job exists already (a create retried) is that Job."""
        namespace, bodies = kj.job_manifests(submission, image=self.image, gpu_type_label=self.gpu_type_label)
        wanted = {str(int(i)) for i in indexes}
        self._jobs_create(namespace, [b for b in bodies if b["metadata"]["labels"].get(kj.LABEL_TASK) in wanted])

    def _jobs_create(self, namespace: str, bodies: list[dict]) -> None:
        """One create per Job, in order; a 409 AlreadyExists (a create retried after it went through: the
        name is the portal job's, and task's) is that Job, checked by its label, never a second one."""
        from kubernetes.client.exceptions import ApiException

        batch = self._api("BatchV1Api")
        for body in bodies:
            try:
                self._call("create job", batch.create_namespaced_job, namespace, body)
            except ApiException as exc:
                if exc.status == 404:
                    raise t.SlurmRejected(f"namespace {namespace!r} does not exist on {self.cluster}") from None
                existing = self._call("read job", batch.read_namespaced_job, body["metadata"]["name"], namespace)
                if (existing.metadata.labels or {}).get(kj.LABEL_JOB) != body["metadata"]["labels"][kj.LABEL_JOB]:
                    raise t.SlurmRejected(f"a Job named {body['metadata']['name']} exists and is not this job's") from None

    def find_by_comments(self, comments) -> dict[str, int]:
        """The job number of the portal's Job carrying each tag (a relay claimed again looks up the jobs
        an interrupted run may have created), for those the API server holds: ONE list of Jobs by the
        tags' job uuids (label ``gpuportal.io/job in (…)``, up to DELETE_BATCH a call) — what the
        Job's name and labels are made of — instead of the base's queue() and accounting(), each the
        sync's cluster-wide lists of the namespaces and of every portal Job and pod (up to six
        requests, growing with the Jobs the cluster holds). A Job being deleted is still held."""
        from .tags import tagged_job_id

        wanted: dict[str, str] = {}
        for comment in comments:
            if comment and (found := tagged_job_id(comment)) is not None:
                wanted[str(found)] = comment
        batch, out = self._api("BatchV1Api"), {}
        uuids = sorted(wanted)
        for i in range(0, len(uuids), DELETE_BATCH):
            selector = f"{kj.LABEL_MANAGED}={kj.MANAGED_BY},{kj.LABEL_JOB} in ({','.join(uuids[i : i + DELETE_BATCH])})"
            for job in self._call("list jobs", batch.list_job_for_all_namespaces, label_selector=selector).items:
                labels = job.metadata.labels or {}
                if labels.get(kj.LABEL_JOB) in wanted:
                    out[wanted[labels[kj.LABEL_JOB]]] = int(labels[kj.LABEL_NUMBER])
        return out

    def cancel(self, job_id: int) -> t.AccountingRecord | list[t.AccountingRecord] | None:
        """Delete the job's Job (an array's: each task's), found by its number's label with one
        cluster-scoped list, with propagationPolicy Foreground: the API server answers with the Job and
        the deletionTimestamp it set, and keeps the Job until its pod is gone. A Job already gone is no
        error.

        Kubernetes keeps no accounting, and a deleted Job's pod leaves no reading of its end: so a
        running job's cancel returns what ran — its pod's start to that deletionTimestamp, CANCELLED
        (the portal records it at once: jobs.services.cancel) — None when its pod never started or
        had ended (the usage ingestion reads those); an array's, a list of its running tasks'. One more
        list (its pods) when the Job exists."""
        jobs, ran = self._jobs_delete_foreground(f"{kj.LABEL_MANAGED}={kj.MANAGED_BY},{kj.LABEL_NUMBER}={int(job_id)}")
        if len(jobs) == 1 and kj.LABEL_TASK not in (jobs[0].metadata.labels or {}):
            return ran[0] if ran else None
        return ran or None  # an array: what each of its running tasks ran

    def cancel_array_task(self, array_job_id: int, index: int) -> list[t.AccountingRecord] | None:
        """Delete one task's Job of an array (its labels), as ``cancel`` deletes a job's: what the task
        ran up to its deletion returned, for the portal to record (a list of one; None when it was not
        running). A task whose Job does not exist (not created yet under the array's %N limit, or gone)
        has nothing to delete: no error."""
        selector = f"{kj.LABEL_MANAGED}={kj.MANAGED_BY},{kj.LABEL_NUMBER}={int(array_job_id)},{kj.LABEL_TASK}={int(index)}"
        _, ran = self._jobs_delete_foreground(selector)
        return ran or None

    def _jobs_delete_foreground(self, selector: str) -> tuple[list, list[t.AccountingRecord]]:
        """The Jobs of ``selector`` (one cluster-scoped list) deleted with propagationPolicy Foreground,
        and what each running one ran up to the deletionTimestamp the API server answered (its pods:
        one more list, when there are Jobs). Returns (the Jobs listed, those records)."""
        import json

        from kubernetes.client.exceptions import ApiException

        batch, core = self._api("BatchV1Api"), self._api("CoreV1Api")
        jobs = self._call("list jobs", batch.list_job_for_all_namespaces, label_selector=selector).items
        pods = self._call("list pods", core.list_pod_for_all_namespaces, label_selector=selector).items if jobs else []
        ran: list[t.AccountingRecord] = []
        for job in jobs:
            try:
                response = self._call("delete job", batch.delete_namespaced_job, job.metadata.name, job.metadata.namespace,
                                      propagation_policy="Foreground", _preload_content=False)  # fmt: skip
            except ApiException:  # 404: gone already (ended and deleted, or a cancel repeated)
                continue
            try:
                stamp = (json.loads(response.data).get("metadata") or {}).get("deletionTimestamp")
            except ValueError:
                stamp = None
            mine = [p for p in pods if _owner(p) == _owner(job)]
            pod = max(mine, key=lambda p: p.metadata.creation_timestamp) if mine else None
            if stamp and _state(job, pod) == "RUNNING" and _started(pod) and _terminated(pod) is None:
                deleted_at = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
                ran.append(dataclasses.replace(_record(job, pod, deleted_at), state="CANCELLED", end_time=deleted_at))
        return jobs, ran

    def jobs_delete(self, jobs: Collection[tuple[str, int]]) -> tuple[int, list[str]]:
        """Delete finished Jobs, given as (namespace, job number), in bulk: one ``deletecollection`` per
        namespace by the numbers' label (``in (…)``, up to DELETE_BATCH numbers a call), with
        propagationPolicy Background (their pods go with them). A namespace where the portal's
        account may not delete is skipped (NotPermitted: its Jobs stay for a later cycle) and said.
        Returns (Jobs asked to be deleted, a message per namespace skipped)."""
        from kubernetes.client.exceptions import ApiException

        batch = self._api("BatchV1Api")
        by_namespace: dict[str, list[int]] = {}
        for namespace, number in jobs:
            by_namespace.setdefault(namespace, []).append(int(number))
        deleted, skipped = 0, []
        for namespace, numbers in sorted(by_namespace.items()):
            for i in range(0, len(numbers), DELETE_BATCH):
                chunk = sorted(numbers[i : i + DELETE_BATCH])
                selector = f"{kj.LABEL_MANAGED}={kj.MANAGED_BY},{kj.LABEL_NUMBER} in ({','.join(map(str, chunk))})"
                try:
                    self._call("delete jobs", batch.delete_collection_namespaced_job, namespace,
                               label_selector=selector, propagation_policy="Background")  # fmt: skip
                except t.NotPermitted as exc:
                    logger.warning("cluster %s: finished Jobs in namespace %s not deleted: %s", self.cluster, namespace, exc.message)
                    skipped.append(f"namespace {namespace}: its finished Jobs are not deleted, the portal's service account "
                                   "may not delete Jobs there (its RoleBinding missing?)")  # fmt: skip
                    break
                except ApiException:  # 404: the namespace is gone, and its Jobs with it
                    break
                deleted += len(chunk)
        return deleted, skipped

    def job_log(self, job_id: int, *, account: str, limit_bytes: int, task: int | None = None) -> bytes | None:
        """The newest pod's log (stdout and stderr as one), its first ``limit_bytes``; b"" before a pod
        runs; ``task``: of that array task's Job. One list of the namespace's pods of the job, one pods/log read."""
        from kubernetes.client.exceptions import ApiException

        core = self._api("CoreV1Api")
        selector = f"{kj.LABEL_NUMBER}={int(job_id)}" + (f",{kj.LABEL_TASK}={int(task)}" if task is not None else "")
        pod = _newest_started(self._call("list pods", core.list_namespaced_pod, account, label_selector=selector).items)
        if pod is None:
            return b""
        try:
            return self._pod_log(core, pod, limit_bytes)
        except ApiException as exc:  # 404: the pod went meanwhile (a cancel)
            raise t.SlurmRejected(f"pods/log: {exc.status} {_message(exc)}") from None

    def job_logs(self, jobs: Collection[tuple[str, int]], *, limit_bytes: int, task: int | None = None) -> tuple[dict[int, dict[int | None, tuple[str, bytes]]], list[str]]:
        """What ``job_log`` serves, for many Jobs given as (namespace, job number): by number, by array
        task index (None: a job that is not an array; an array's tasks are a Job each; ``task``: that
        array task's alone), the newest
        started pod's name and its log's first ``limit_bytes`` — {} when no pod of the job started, or
        its pods are gone. ONE cluster-scoped list of their pods (by the numbers' label, up to
        DELETE_BATCH numbers a call), then one pods/log read per pod: Kubernetes has no read of many
        logs. A job one of whose logs cannot be read now (its node's kubelet not answering: the API
        server's 5xx; its pod going meanwhile) is left out and said in the log; in a namespace where the
        portal's account may not read logs (NotPermitted: its RoleBinding missing) the namespace's other
        jobs are not tried, and a message says so. The list failing raises SlurmUnavailable. Returns
        (the logs by job number and task, a message per namespace skipped)."""
        from kubernetes.client.exceptions import ApiException

        core = self._api("CoreV1Api")
        wanted = {int(number): namespace for namespace, number in jobs}
        numbers = sorted(wanted)
        pods: dict[int, dict[int | None, list]] = {}
        for i in range(0, len(numbers), DELETE_BATCH):
            chunk = numbers[i : i + DELETE_BATCH]
            selector = f"{kj.LABEL_MANAGED}={kj.MANAGED_BY},{kj.LABEL_NUMBER} in ({','.join(map(str, chunk))})"
            selector += f",{kj.LABEL_TASK}={int(task)}" if task is not None else ""
            for pod in self._call("list pods", core.list_pod_for_all_namespaces, label_selector=selector).items:
                labels = pod.metadata.labels or {}
                number, task = int(labels.get(kj.LABEL_NUMBER, "0")), labels.get(kj.LABEL_TASK)
                if wanted.get(number) == pod.metadata.namespace:
                    pods.setdefault(number, {}).setdefault(int(task) if task is not None else None, []).append(pod)
        out: dict[int, dict[int | None, tuple[str, bytes]]] = {}
        denied: dict[str, str] = {}
        for number in numbers:
            namespace, logs = wanted[number], {}
            for task, candidates in sorted(pods.get(number, {}).items(), key=lambda item: -1 if item[0] is None else item[0]):
                pod = _newest_started(candidates)
                if pod is None or namespace in denied:
                    continue
                try:
                    logs[task] = (pod.metadata.name, self._pod_log(core, pod, limit_bytes))
                except (ApiException, t.SlurmError) as exc:  # ApiException: 404, the pod went meanwhile
                    message = exc.message if isinstance(exc, t.SlurmError) else f"{exc.status} {_message(exc)}"
                    logger.warning("cluster %s: the log of pod %s/%s not read: %s", self.cluster, namespace,
                                   pod.metadata.name, message)  # fmt: skip
                    if isinstance(exc, t.NotPermitted) and exc.namespace:
                        denied[exc.namespace] = (f"namespace {exc.namespace}: its finished Jobs are not deleted, the portal's "
                                                 "service account may not read their pods' logs there to keep them (its "
                                                 "RoleBinding missing?)")  # fmt: skip
                    logs = None
                    break
            if logs is not None and namespace not in denied:
                out[number] = logs
        return out, list(denied.values())

    def _pod_log(self, core, pod, limit_bytes: int) -> bytes:
        """One pods/log read (CoreV1Api.read_namespaced_pod_log) of the job's container: its first
        ``limit_bytes`` as the API server cuts them ("slightly more or slightly less", says its
        documentation), as bytes."""
        response = self._call("pods/log", core.read_namespaced_pod_log, pod.metadata.name, pod.metadata.namespace,
                              container=kj.CONTAINER, limit_bytes=max(int(limit_bytes), 1), _preload_content=False)  # fmt: skip
        return response.data

    def queue(self) -> list[t.QueueEntry]:
        return [_entry(job, pod, reason) for job, pod, reason in self._jobs(with_reasons=True)]

    def accounting(
        self, start: dt.datetime, end: dt.datetime, *, job_ids: Collection[int] | None = None
    ) -> list[t.AccountingRecord]:
        rows = self._jobs(with_reasons=False)
        now = dt.datetime.now(dt.UTC)
        listed = [_record(job, pod, now) for job, pod, _ in rows]
        if job_ids is None:  # the usage ingestion: as sacct -S -E, every Job of the window, running ones so far
            return [r for r in listed if r.submit_time <= end and (r.end_time is None or r.end_time >= start)]
        records = [r for r in listed if r.state not in ("PENDING", "RUNNING")]
        if job_ids is not None:  # every managed namespace was read: a Job not listed is gone
            known = {r.array_job_id or r.job_id for r in listed}  # an array's tasks: as sacct -j <array id>
            records = [r for r in records if (r.array_job_id or r.job_id) in job_ids]
            records += [_deleted(number, now) for number in job_ids if number not in known]
        return records

    def _jobs(self, *, with_reasons: bool) -> list[tuple]:
        """(Job, its pod or None, the reason it waits) of every portal Job, whatever the number of
        namespaces and Jobs: ONE cluster-scoped list of the managed namespaces, ONE of the portal's
        Jobs and ONE of their pods (by label; the service account's ClusterRole allows exactly these
        lists, scripts/lib/k8s-bootstrap.py), and, when a Job waits, ONE of the Warning events. Only
        Jobs in a managed namespace that is not being deleted are the portal's; a list fails as a
        whole or reads every namespace, so a Job it does not show is gone."""
        batch, core = self._api("BatchV1Api"), self._api("CoreV1Api")
        selector = f"{kj.LABEL_MANAGED}={kj.MANAGED_BY}"
        found = self._call("list namespaces", core.list_namespace, label_selector=MANAGED_NAMESPACES).items
        managed = {n.metadata.name for n in found if n.metadata.deletion_timestamp is None}
        jobs = [j for j in self._call("list jobs", batch.list_job_for_all_namespaces, label_selector=selector).items
                if j.metadata.namespace in managed]  # fmt: skip
        if not jobs:
            return []
        pods: dict[str, object] = {}
        for pod in self._call("list pods", core.list_pod_for_all_namespaces, label_selector=selector).items:
            owner = _owner(pod)
            if owner not in pods or pod.metadata.creation_timestamp > pods[owner].metadata.creation_timestamp:
                pods[owner] = pod
        waiting = {j.metadata.uid for j in jobs if _waits(j, pods.get(_owner(j)))}
        events = []
        if with_reasons and waiting:
            events = self._call("list events", core.list_event_for_all_namespaces, field_selector="type=Warning").items
        out = []
        for job in jobs:
            pod = pods.get(_owner(job))
            out.append((job, pod, _waiting_reason(job, pod, events) if job.metadata.uid in waiting else ""))
        return out

    # -- inventory ----------------------------------------------------------------------------------

    def partitions(self) -> list[t.Partition]:
        names = tuple(node.metadata.name for node in self._gpu_nodes())
        return [t.Partition(PARTITION, is_default=True, state="UP", default_time_minutes=None,
                            max_time_minutes=None, nodes=names)]  # fmt: skip

    def _gpu_nodes(self) -> list:
        """The nodes that offer GPUs (allocatable nvidia.com/gpu), one list of the nodes."""
        core = self._api("CoreV1Api")
        nodes = self._call("list nodes", core.list_node).items
        return [n for n in nodes if int((n.status.allocatable or {}).get(kj.GPU_RESOURCE, "0") or 0)]

    def nodes(self) -> list[t.Node]:
        used: dict[str, int] = {}
        for job, pod, _ in self._jobs(with_reasons=False):
            if pod is not None and pod.spec.node_name and pod.status.phase in ("Pending", "Running"):
                used[pod.spec.node_name] = used.get(pod.spec.node_name, 0) + _pod_gpus(pod)
        out = []
        for node in self._gpu_nodes():
            allocatable = node.status.allocatable or {}
            gpus = int(allocatable.get(kj.GPU_RESOURCE, "0") or 0)
            ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
            busy = used.get(node.metadata.name, 0)
            state = "DOWN" if not ready else "DRAIN" if node.spec.unschedulable else (
                "IDLE" if not busy else "ALLOCATED" if busy >= gpus else "MIXED")  # fmt: skip
            out.append(t.Node(
                name=node.metadata.name, state=state, partitions=(PARTITION,),
                gpu_type=(node.metadata.labels or {}).get(self.gpu_type_label, ""), gpus_total=gpus,
                gpus_allocated=min(busy, gpus), cpus_total=_cpus(allocatable.get("cpu", "0")), cpus_allocated=0,
                memory_mb=_memory_mb(allocatable.get("memory", "0")), reason="" if ready else "not Ready",
            ))  # fmt: skip
        return out

    def policy(self) -> t.ClusterPolicy:
        return t.ClusterPolicy(qos=(), account_qos={}, max_array_size=None, over_time_limit_minutes=0, kill_wait_seconds=0)

    # -- what only Slurm has --------------------------------------------------------------------------

    def _slurm_only(self, what: str):
        raise t.SlurmRejected(f"{what}: a Slurm feature; {self.cluster} is a Kubernetes cluster")

    def reservation_create(self, spec: t.ReservationSpec) -> str:
        self._slurm_only("reservations")

    def reservation_delete(self, name: str) -> None:
        return None

    def reservation_list(self) -> list[t.Reservation]:
        return []

    def associations(self) -> list[t.Association]:
        return []

    def account_add(self, account: str, *, description: str = "", parent: str = "") -> None:
        self._slurm_only("accounts")

    def account_remove(self, account: str) -> None:
        self._slurm_only("accounts")

    def user_add(self, user: str, account: str, *, default: bool = False) -> None:
        self._slurm_only("associations")

    def user_remove(self, user: str, account: str) -> None:
        self._slurm_only("associations")

    # -- the team's GPU cap: its namespace's ResourceQuota -------------------------------------------

    def association_limits_held(self, limits: t.AssociationLimits) -> t.AssociationLimits:
        """What a namespace can hold of a team's limits: its cap on GPUs at once (GrpTRES gres/gpu) as
        the ResourceQuota ``requests.nvidia.com/gpu``. A GPU-hour budget (GrpTRESMins) has no
        Kubernetes counterpart (the portal's budget holds enforce it), nor a per-type cap (a quota
        cannot count one node selector's GPUs); and for an extended resource Kubernetes admits only
        ``requests.`` quota items — it counts a pod's GPU limits there (requests equal limits)."""
        cap = limits.grp_tres.get("gres/gpu")
        return t.AssociationLimits(account=limits.account, grp_tres={} if cap is None else {"gres/gpu": int(cap)})

    def association_limits_get(self, account: str) -> t.AssociationLimits:
        """The namespace's GPU cap as Kubernetes enforces it: the lowest ``requests.nvidia.com/gpu`` of
        its ResourceQuotas (the portal's own, QUOTA_NAME, or one made by hand). One list."""
        from kubernetes.client.exceptions import ApiException

        core = self._api("CoreV1Api")
        try:
            quotas = self._call("list resourcequotas", core.list_namespaced_resource_quota, account).items
        except ApiException as exc:  # 404: no such namespace
            raise t.SlurmRejected(f"namespace {account!r} on {self.cluster}: {exc.status} {_message(exc)}") from None
        caps = [_count(q.spec.hard[QUOTA_RESOURCE]) for q in quotas if QUOTA_RESOURCE in (q.spec.hard or {})]
        return t.AssociationLimits(account=account, grp_tres={"gres/gpu": min(caps)} if caps else {})

    def association_limits_set(self, limits: t.AssociationLimits) -> None:
        """The portal's ResourceQuota (QUOTA_NAME) in the team's namespace to the team's cap: created,
        or patched to it when it exists; deleted when the team has no cap. Idempotent."""
        from kubernetes.client.exceptions import ApiException

        core, namespace = self._api("CoreV1Api"), limits.account
        cap = self.association_limits_held(limits).grp_tres.get("gres/gpu")
        try:
            if cap is None:
                self._call("delete resourcequota", core.delete_namespaced_resource_quota, QUOTA_NAME, namespace)
                return
            body = {"apiVersion": "v1", "kind": "ResourceQuota",
                    "metadata": {"name": QUOTA_NAME, "labels": {kj.LABEL_MANAGED: kj.MANAGED_BY}},
                    "spec": {"hard": {QUOTA_RESOURCE: str(int(cap))}}}  # fmt: skip
            try:
                self._call("create resourcequota", core.create_namespaced_resource_quota, namespace, body)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                self._call("patch resourcequota", core.patch_namespaced_resource_quota, QUOTA_NAME, namespace, body)
        except ApiException as exc:  # 404: the namespace (or, deleting, the quota) is not there
            if exc.status == 404 and cap is None:
                return
            raise t.SlurmRejected(f"namespace {namespace!r} on {self.cluster}: {exc.status} {_message(exc)}") from None

    def account_usage_reset(self, account: str) -> None:
        return None

    def account_gpu_minutes(self, start: dt.datetime, end: dt.datetime) -> dict[str, int]:
        return {}

    def usage_rolled_up(self, start: dt.datetime, end: dt.datetime) -> bool:
        return False


# -- reading Jobs and pods ---------------------------------------------------------------------------


def _message(exc) -> str:
    import json

    try:
        return json.loads(exc.body).get("message") or exc.reason
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


def _conditions(job) -> dict[str, object]:
    return {c.type: c for c in job.status.conditions or [] if c.status == "True"}


def _terminated(pod):
    statuses = (pod.status.container_statuses or []) if pod is not None else []
    return statuses[0].state.terminated if statuses and statuses[0].state else None


def _started(pod) -> dt.datetime | None:
    statuses = (pod.status.container_statuses or []) if pod is not None else []
    state = statuses[0].state if statuses else None
    if state is not None and state.running is not None:
        return state.running.started_at
    if state is not None and state.terminated is not None:
        return state.terminated.started_at
    return None


def _state(job, pod) -> str:
    """Slurm's word for the Job's state (jobs.choices.state_from_slurm reads it). A Job being deleted is
    CANCELLED, unless it had ended before (its Complete or Failed condition not newer than the deletion —
    the API's times are whole seconds, and a condition of the deletion's own second is taken as earlier:
    a finished task of an array cancelled whole keeps its end)."""
    conditions = _conditions(job)
    deleted = job.metadata.deletion_timestamp
    ended = conditions.get("Complete") or conditions.get("Failed")
    if deleted is not None and (ended is None or ended.last_transition_time is None or ended.last_transition_time > deleted):
        return "CANCELLED"
    if "Complete" in conditions:
        return "COMPLETED"
    if "Failed" in conditions:
        return "TIMEOUT" if conditions["Failed"].reason == "DeadlineExceeded" else "FAILED"
    if pod is not None and pod.status.phase in ("Running", "Succeeded", "Failed"):
        return "RUNNING"  # a pod that ended: the Job controller's condition comes next
    return "PENDING"


def _newest_started(pods):
    """The pod a Job's log is read from: its newest that was bound to a node and left Pending (None: none)."""
    started = [p for p in pods if p.spec.node_name and p.status.phase != "Pending"]
    return max(started, key=lambda p: p.metadata.creation_timestamp) if started else None


def _waits(job, pod) -> bool:
    return _state(job, pod) == "PENDING"


def _waiting_reason(job, pod, events) -> str:
    """The newest Warning event about the Job's pod (the scheduler's FailedScheduling) or the Job
    (the Job controller's FailedCreate: a quota's refusal), in Kubernetes' words."""
    names = {("Job", job.metadata.name)} | ({("Pod", pod.metadata.name)} if pod is not None else set())
    mine = [e for e in events if (e.involved_object.kind, e.involved_object.name) in names
            and e.metadata.namespace == job.metadata.namespace]  # fmt: skip
    if not mine:
        return "Waiting for the scheduler" if pod is not None else "Waiting for the Job controller"
    newest = max(mine, key=lambda e: e.last_timestamp or e.event_time or e.metadata.creation_timestamp)
    return (newest.message or newest.reason or "").strip()


def _pod_gpus(pod) -> int:
    limits = (pod.spec.containers[0].resources.limits or {}) if pod.spec.containers else {}
    return int(limits.get(kj.GPU_RESOURCE, "0") or 0)


def _gpu_type(job, label_default: str = "") -> str:
    selector = job.spec.template.spec.node_selector or {}
    return next(iter(selector.values()), label_default)


def _owner(item) -> tuple[str, str]:
    """A Job's or pod's portal job uuid and array task index ("" for a job that is not an array)."""
    labels = item.metadata.labels or {}
    return labels.get(kj.LABEL_JOB, ""), labels.get(kj.LABEL_TASK, "")


def _common(job, pod) -> dict:
    labels = job.metadata.labels or {}
    annotations = job.metadata.annotations or {}
    deadline = job.spec.active_deadline_seconds
    number = int(labels.get(kj.LABEL_NUMBER, "0"))
    task = labels.get(kj.LABEL_TASK)  # an array task: its own id, and its array's (as squeue %A, %F, %K)
    return {
        "job_id": kj.task_number(number, int(task)) if task is not None else number,
        "array_job_id": number if task is not None else None,
        "array_tasks": task or "",
        "name": annotations.get(kj.ANNOTATION_NAME, job.metadata.name),
        "user": str(job.spec.template.spec.security_context.run_as_user or "")
        if job.spec.template.spec.security_context else "",
        "account": job.metadata.namespace,
        "partition": PARTITION,
        "state": _state(job, pod),
        "comment": annotations.get(kj.ANNOTATION_TAG, ""),
        "submit_time": job.metadata.creation_timestamp,
        "start_time": _started(pod),
        "time_limit_minutes": deadline // 60 if deadline else None,
        "num_nodes": 1,
    }


def _end_time(job, pod) -> dt.datetime | None:
    terminated = _terminated(pod)
    if terminated is not None:
        return terminated.finished_at
    if job.metadata.deletion_timestamp is not None:  # a cancel (Foreground): its pod is going
        return job.metadata.deletion_timestamp
    if job.status.completion_time is not None:
        return job.status.completion_time
    failed = _conditions(job).get("Failed")
    return failed.last_transition_time if failed is not None else None


def _entry(job, pod, reason: str) -> t.QueueEntry:
    common = _common(job, pod)
    gpus = int((job.spec.template.spec.containers[0].resources.limits or {}).get(kj.GPU_RESOURCE, "0") or 0)
    gpu_type = _gpu_type(job)
    tres = f"gres:gpu:{gpu_type}:{gpus}" if gpu_type else f"gres:gpu:{gpus}" if gpus else ""
    ended = common["state"] not in ("PENDING", "RUNNING")
    return t.QueueEntry(
        **common, reason=reason or "None", nodes=(pod.spec.node_name or "") if pod is not None else "",
        end_time=_end_time(job, pod) if ended else None, tres_per_node=tres,
    )  # fmt: skip


def _record(job, pod, now: dt.datetime) -> t.AccountingRecord:
    """The Job as an accounting record: its pod's container start and end (the Job controller's
    verdict's time when the pod is gone), its GPUs; a running one's elapsed time is up to ``now``."""
    common = _common(job, pod)
    terminated = _terminated(pod)
    start, end = common["start_time"], _end_time(job, pod)
    end_so_far = end if end is not None else now
    gpus = int((job.spec.template.spec.containers[0].resources.limits or {}).get(kj.GPU_RESOURCE, "0") or 0)
    tres = {"gres/gpu": gpus, **({f"gres/gpu:{_gpu_type(job)}": gpus} if _gpu_type(job) and gpus else {})}
    return t.AccountingRecord(
        **common, exit_code=terminated.exit_code if terminated is not None else None,
        exit_signal=terminated.signal if terminated is not None else None, end_time=end,
        elapsed_seconds=max(int((end_so_far - start).total_seconds()), 0) if start and end_so_far else 0,
        nodes=(pod.spec.node_name or "") if pod is not None else "", alloc_tres=tres if start else {}, req_tres=tres,
    )  # fmt: skip


def _deleted(number: int, now: dt.datetime) -> t.AccountingRecord:
    """A Job the API no longer has: deleted — by the portal's cancel, or by hand — so cancelled."""
    return t.AccountingRecord(
        job_id=int(number), name="", user="", account="", partition=PARTITION, state="CANCELLED", exit_code=None,
        submit_time=None, start_time=None, end_time=now, elapsed_seconds=0, time_limit_minutes=None, num_nodes=1,
        nodes="", alloc_tres={}, req_tres={}, comment="",
    )  # fmt: skip


def _count(quantity: str) -> int:
    """A quota's whole count as Kubernetes writes it ("4"; "2k" is 2000)."""
    text = str(quantity)
    return int(text[:-1]) * 1000 if text.endswith("k") else int(text)


def _cpus(quantity: str) -> int:
    text = str(quantity)
    return int(text[:-1]) // 1000 if text.endswith("m") else int(float(text or 0))


_BINARY = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024**2, "K": 1000 / 1024**2, "M": 1000**2 / 1024**2,
           "G": 1000**3 / 1024**2}  # fmt: skip


def _memory_mb(quantity: str) -> int:
    text = str(quantity)
    for suffix, mib in _BINARY.items():
        if text.endswith(suffix) and text[: -len(suffix)].isdigit():
            return int(int(text[: -len(suffix)]) * mib)
    return int(int(text or 0) / 1024**2) if text.isdigit() else 0
