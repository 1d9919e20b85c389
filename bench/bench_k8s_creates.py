"""Kubernetes Job creates per second (issue 41 item 5): through the portal against a plain loop of creates.

    eval "$(scripts/services up)" && BENCH_DB=<yours> .venv/bin/python bench/bench_k8s_creates.py [--jobs 100] [--rounds 3]
    … bench/bench_k8s_creates.py --profile [--jobs 50]   # where a portal create's time goes (cProfile, API requests)

Needs the local Kubernetes cluster (scripts/k8s up). In the same run, alternating, each round:
  raw     a plain loop of ``create_namespaced_job`` with the Job the portal builds for the same request
          (portal.slurm.kube_job.job_manifest, a fresh tag and name each), one after the other, through
          the portal's own client (its service account);
  portal  N POSTs to ``/api/v1/jobs/``, one after the other (DRF in this process, no HTTP server: the
          view, the validation, the budget hold, the row, the outbox); bench/environment.py runs Celery
          tasks eagerly, so each POST's on-commit relay creates its Job before the POST returns (API →
          Kubernetes Job, per job); a drain (jobs.services.job_relay_drain_run) then takes what is
          left, if anything. The round ends when every job has its Kubernetes id.
Every bench Job is deleted after each round (each asks for 1 GPU: most wait for one, which a create does not). The
namespace is the bench team's (``scripts/k8s namespace``); the portal's cluster list is the default
Slurm cluster (never called) and gpuportal-k8s."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

K8S = "gpuportal-k8s"
NAMESPACE = "gpbench-k8s"
os.environ.setdefault("GPUPORTAL_CLUSTERS", f"name=gpuportal,backend=cli;name={K8S},kind=kubernetes")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # after the clusters are named: Django reads them at its set-up


def body(index: int) -> dict:
    return {"team": common.BENCH_TEAM, "cluster": K8S, "name": f"k8s-bench-{index}", "script": "#!/bin/sh\ntrue\n",
            "gpus": 1, "cpus_per_gpu": 1, "memory_gb": 1, "time_limit_minutes": 1, "workdir": common.BENCH_WORKDIR}  # fmt: skip


def raw_round(gateway, jobs: int, submission) -> float:
    """Seconds for ``jobs`` plain creates of the portal's manifest, one after the other."""
    from portal.slurm import kube_job

    batch = gateway._api("BatchV1Api")
    bodies = []
    for _ in range(jobs):
        tagged = submission(uuid.uuid4())
        bodies.append(kube_job.job_manifest(tagged, image=gateway.image, gpu_type_label=gateway.gpu_type_label)[1])
    began = time.perf_counter()
    for manifest in bodies:
        batch.create_namespaced_job(NAMESPACE, manifest)
    return time.perf_counter() - began


def portal_round(world, jobs: int) -> tuple[float, float]:
    """Seconds from the first POST to the last job's Kubernetes id, and of them the POSTs'."""
    from rest_framework.test import APIClient

    from jobs.models import Job
    from jobs.services import job_relay_drain_run

    api = APIClient()
    api.force_authenticate(user=world.user)
    began = time.perf_counter()
    ids = []
    for index in range(jobs):
        response = api.post("/api/v1/jobs/", body(index), format="json")
        if response.status_code != 201:
            raise SystemExit(f"POST refused: {response.status_code} {response.content[:500]!r}")
        ids.append(response.json()["id"])
    posted = time.perf_counter() - began
    while Job.objects.filter(pk__in=ids, slurm_job_id__isnull=True).exists():
        job_relay_drain_run(limit=50)
    return time.perf_counter() - began, posted


class _Requests:
    """The HTTP requests the kubernetes client's transport (urllib3) makes, counted by (method, path),
    from the DEBUG line urllib3's connection pool logs for each response (as tests/k8s count them)."""

    def __init__(self):
        import collections
        import logging

        self.counts: collections.Counter = collections.Counter()
        self.connections = 0
        outer = self

        class Handler(logging.Handler):
            def emit(self, record):
                if record.getMessage().startswith("Starting new HTTPS connection"):
                    outer.connections += 1
                elif isinstance(record.args, tuple) and len(record.args) >= 5:
                    path = str(record.args[4]).split("?")[0]
                    outer.counts[(record.args[3], "/".join("NAME" if part.startswith("gpuportal-") else part
                                                           for part in path.split("/")))] += 1  # fmt: skip

        self.handler, self.logger = Handler(logging.DEBUG), logging.getLogger("urllib3.connectionpool")

    def __enter__(self):
        import logging

        self.logger.addHandler(self.handler)
        self.level = self.logger.level
        self.logger.setLevel(logging.DEBUG)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.level)


def profile(world, gateway, jobs: int) -> None:
    """One portal round of ``jobs`` under cProfile: the functions by cumulative time, and the API
    requests (and new connections) it made, per job."""
    import cProfile
    import pstats

    clean(gateway)
    profiler = cProfile.Profile()
    with _Requests() as requests:
        profiler.enable()
        total, _ = portal_round(world, jobs)
        profiler.disable()
    clean(gateway)
    print(f"  {jobs} jobs through the portal in {total:.2f} s ({1000 * total / jobs:.1f} ms a job); "
          f"API requests per job: {sum(requests.counts.values()) / jobs:.2f}, new connections {requests.connections}")  # fmt: skip
    for (method, path), count in requests.counts.most_common():
        print(f"    {count / jobs:6.2f} a job  {method} {path}")
    stats = pstats.Stats(profiler)
    stats.sort_stats("cumulative").print_stats(r"gpuportal|jobs/|portal/|accounting/|kubernetes/client/api|urllib3/connectionpool", 40)
    stats.sort_stats("tottime").print_stats(15)


def clean(gateway) -> None:
    """Delete the namespace's bench Jobs, one by one (the portal's account may not deletecollection)."""
    batch = gateway._api("BatchV1Api")
    for job in batch.list_namespaced_job(NAMESPACE, label_selector="gpuportal.io/managed-by=gpuportal").items:
        batch.delete_namespaced_job(job.metadata.name, NAMESPACE, propagation_policy="Background")


def run(*, jobs: int, rounds: int, quick: bool = False, profile_only: bool = False) -> common.Section:
    from jobs.services.relay import _submission_for
    from portal.models import TeamClusterAccount
    from portal.services import cluster_row, cluster_sync, clusters_record
    from portal.slurm import get_gateway

    if quick:
        jobs, rounds = 20, 1
    section = common.Section(title=f"Kubernetes Job creates per second ({jobs} jobs, {rounds} rounds)")
    world = common.begin(section, slurm=False, truncate=True)
    subprocess.run([str(common.ROOT / "scripts" / "k8s"), "namespace", NAMESPACE], check=True, capture_output=True)
    clusters_record()
    cluster_sync(cluster=K8S)
    TeamClusterAccount.objects.get_or_create(team=world.team, cluster=cluster_row(K8S), defaults={"slurm_account": NAMESPACE})
    gateway = get_gateway(K8S)
    clean(gateway)

    # one stored request of the bench's shape: the raw loop sends what the relay sends, each with its own tag
    from jobs.models import Job

    portal_round(world, 1)
    template = Job.objects.filter(cluster__name=K8S).latest("created_at")

    def submission(tag):
        import dataclasses

        from portal.slurm.tags import slurm_tag

        built = _submission_for(template)
        options = tuple((o, slurm_tag(tag) if o == "comment" else v) for o, v in built.request.options)
        return dataclasses.replace(built, request=dataclasses.replace(built.request, options=options))

    clean(gateway)
    if profile_only:
        profile(world, gateway, jobs)
        return section
    raw_rates, portal_rates, left = [], [], []
    for _ in range(rounds):
        raw_rates.append(jobs / raw_round(gateway, jobs, submission))
        clean(gateway)
        total, posted = portal_round(world, jobs)
        portal_rates.append(jobs / total)
        left.append(round(total - posted, 3))
        clean(gateway)
    load = os.getloadavg()[0]
    section.add("plain create loop (same client, same manifest)", common.median(raw_rates), "Jobs/s", f"median of {rounds}")
    section.add("through the portal (POST, its relay → Job)", common.median(portal_rates), "Jobs/s", f"median of {rounds}")
    section.notes.append(f"load average (1 min) at the end: {load:.2f}; raw {[round(r, 1) for r in raw_rates]}, "
                         f"portal {[round(r, 1) for r in portal_rates]}; seconds left to the drain after the POSTs {left}")  # fmt: skip
    print(f"  {section.notes[-1]}")
    return section


if __name__ == "__main__":
    parser = common.arguments(__doc__, quick="20 jobs, one round")
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", dest="profile_only", action="store_true",
                        help="one portal round under cProfile, with the API requests it made counted (no figures)")
    common.main(run, parser)
