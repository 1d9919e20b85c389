"""Helpers shared by tests (not fixtures): a call-counting wrapper for the real gateway, polling,
Slurm tags, a valid job body."""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter

import pytest

# The cache (throttle counters, idempotency keys): the tests use Redis database 12, not the demo's
# (CACHE_URL, database 1), and each run keeps its keys under a prefix of its own (tests/conftest.py)
# and clears only those, never the whole database (cache.clear() is FLUSHDB): concurrent runs on one
# machine neither count nor clear each other's throttle buckets.
CACHE_TEST_DB = 12
CACHE_KEY_PREFIX = f"gpuportal-test-p{os.getpid()}"


def cache_test_location(location):
    """The cache's LOCATION (settings: a list of one URL) with the tests' database:
    redis://host:port/1 -> redis://host:port/12; each part of a sentinel://…;sentinel://… URL alike."""
    if not isinstance(location, str):
        return [cache_test_location(one) for one in location]

    def one(url: str) -> str:
        base, sep, last = url.rstrip("/").rpartition("/")
        return f"{base}/{CACHE_TEST_DB}" if sep and last.isdigit() and "//" in base else f"{url.rstrip('/')}/{CACHE_TEST_DB}"

    return ";".join(one(part) for part in location.split(";"))


def cache_clear() -> None:
    """Delete this run's cache keys (CACHE_KEY_PREFIX), and only those."""
    from django.core.cache import cache

    from portal.redis_client import redis_client
    from portal.throttles import _cache_write_server

    with redis_client(_cache_write_server()) as client:
        keys = list(client.scan_iter(match=f"{cache.key_prefix}:*", count=1000))
        if keys:
            client.delete(*keys)


class CountingGateway:
    """Wraps the real gateway; counts every method call by name."""

    def __init__(self, real):
        self._real = real
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted


def slurm_tags(*, accounts: set[str] | None = None) -> set[str]:
    """Tags (comments) of every job the controller holds now (``accounts``: only those accounts' jobs)."""
    from portal.slurm import get_gateway

    return {e.comment for e in get_gateway().queue() if e.comment and (accounts is None or e.account in accounts)}


def slurm_tag_counts(jobs) -> Counter:
    """How many jobs the controller holds with each of these jobs' tags (a job relayed twice: 2)."""
    from portal.slurm import get_gateway

    tags = {j.slurm_tag for j in jobs}
    return Counter(e.comment for e in get_gateway().queue() if e.comment in tags)


def slurm_cancel_tagged(jobs) -> None:
    """A test's clean-up: scancel every job the controller holds with these jobs' tags (a job that
    was relayed twice, or left behind by a crashed relay, included)."""
    from portal.slurm import get_gateway

    tags = {j.slurm_tag for j in jobs}
    gateway = get_gateway()
    for entry in gateway.queue():
        if entry.comment in tags:
            gateway.cancel(entry.job_id)


def relay_crashed_after_sbatch(job) -> int:
    """What a relay that crashed leaves behind: it claimed ``job`` (attempt 1), sbatch succeeded, it
    died before the write, and its lease has expired. Returns the Slurm id that sbatch gave."""
    from django.utils import timezone

    from jobs import services
    from jobs.models import Job
    from portal.slurm import get_gateway

    assert len(services._claim([job.pk])[1]) == 1
    row = Job.objects.select_related("team", "submitter__profile").get(pk=job.pk)
    slurm_id = get_gateway().submit(services._submission_for(row))
    expired = timezone.now() - timezone.timedelta(seconds=services.relay_lease_seconds() + 1)
    Job.objects.filter(pk=job.pk).update(relay_started_at=expired)
    return slurm_id


def slurm_job(
    script: str,
    *,
    account: str,
    partition: str = "",
    name: str = "gpuportal",
    gpus: int = 1,
    gpu_type: str = "",
    nodes: int = 1,
    cpus_per_gpu: int = 1,
    memory_mb: int | None = None,
    time_limit_minutes: int | None = None,
    workdir: str = "/tmp",
    submit_dir: str = "",
    stdout: str = "",
    stderr: str = "",
    environment: dict | None = None,
    comment: str = "",
    reservation: str = "",
    uid: int | None = None,
    gid: int | None = None,
    options=None,
    directives=None,
):
    """A submission for the gateway tests, built by the one builder (portal.slurm.request.job_request)
    from a script and either typed fields (what a job of the portal would get on its command line
    for them) or ``options`` (the command line, account and comment added)."""
    from portal.slurm import JobSubmission
    from portal.slurm.request import job_request

    if options is None:
        options = [("job-name", name), ("partition", partition), ("nodes", str(nodes)), ("chdir", workdir)]
        if gpus:
            options.append(("gres", f"gpu:{gpu_type}:{gpus // nodes}" if gpu_type else f"gpu:{gpus // nodes}"))
            options.append(("cpus-per-gpu", str(cpus_per_gpu)))
        if memory_mb is not None:
            options.append(("mem", str(int(memory_mb))))
        if time_limit_minutes is not None:
            options.append(("time", str(int(time_limit_minutes))))
        if stdout:
            options.append(("output", stdout))
        if stderr:
            options.append(("error", stderr))
    command_line = [*options, ("account", account)] + ([("comment", comment)] if comment else [])
    request = job_request(script=script, directives=directives, command_line=command_line, workdir=workdir,
                          submit_dir=submit_dir or workdir, environment=environment, gpus=gpus, gpu_type=gpu_type,
                          nodes=nodes, time_limit_minutes=time_limit_minutes or 0)  # fmt: skip
    return JobSubmission(request, reservation=reservation, uid=uid, gid=gid)


def output_patterns(workdir: str, array: str = "") -> dict:
    """A job row's output_pattern and error_pattern as job_submit stores them (jobs.spec.output_files:
    JOB_OUTPUT_PATTERN in force now, the script naming none)."""
    from jobs.spec import output_files

    output, error = output_files(workdir=workdir, array=array)
    return {"output_pattern": output, "error_pattern": error}


def stored_request(job) -> dict:
    """The request job_submit would store for a job row made by a test (``job``: a Job, or a
    factory's resolver with its attributes): its name, partition, GPUs and time limit on the
    command line, its output files, its team's account and its tag."""
    from jobs.spec import output_files
    from portal.slurm.request import job_request
    from portal.slurm.tags import slurm_tag

    array = getattr(job, "array", "") or ""
    output, error = output_files(workdir=job.workdir, array=array)
    command_line = [("job-name", job.name), ("partition", job.partition), ("chdir", job.workdir),
                    ("gres", f"gpu:{job.gpu_type}:{job.gpus}" if job.gpu_type else f"gpu:{job.gpus}"),
                    ("time", str(job.time_limit_minutes)), ("output", output)]  # fmt: skip
    command_line += [("error", error)] if error else []
    command_line += [("array", array)] if array else []
    command_line += [("account", job.team.slurm_account), ("comment", slurm_tag(job.id))]
    return job_request(script=job.script, command_line=command_line, workdir=job.workdir,
                       submit_dir=getattr(job, "submit_dir", "") or job.workdir, gpus=job.gpus, gpu_type=job.gpu_type,
                       time_limit_minutes=job.time_limit_minutes).to_json()  # fmt: skip


def job_overrides(job) -> list[list]:
    """What the fields and the portal's choices put on a stored job's (or a checked spec's) sbatch command line (chdir,
    partition, account...), without the portal's output files and tag."""
    request = job.request  # a stored job's (JSON), or a checked spec's (jobs.spec.ValidSpec: the JobRequest)
    command_line = request["command_line"] if isinstance(request, dict) else request.command_line
    return [list(option) for option in command_line if option[0] not in ("output", "error", "comment")]


def with_options(submission, *options):
    """``submission`` with ``options`` ((option, value) pairs, e.g. ("hold", None)) added to the end of
    its command line, as sbatch's command line would add them (none of them replaces a directive)."""
    import dataclasses

    request = submission.request
    request = dataclasses.replace(request, command_line=(*request.command_line, *options), options=(*request.options, *options),
                                  lines=(*request.lines, *(0 for _ in options)))  # fmt: skip
    return dataclasses.replace(submission, request=request)


def wait_for(predicate, *, timeout: float = 60.0, interval: float = 0.2, what: str = "the condition"):
    """Poll until predicate() is truthy; returns its value or fails after timeout (naming ``what``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def job_payload(**overrides) -> dict:
    """A valid submit body for team vision."""
    body = {
        "team": "vision",
        "name": "train-resnet",
        "script": "#!/bin/bash\necho hello\n",
        "partition": "gpu",
        "gpu_type": "a100",
        "gpus": 2,
        "nodes": 1,
        "cpus_per_gpu": 2,
        "memory_gb": 16,
        "time_limit_minutes": 30,
        "environment": {"EPOCHS": "3"},
    }
    body.update(overrides)
    return body


def skip_unless_ci(reason: str) -> None:
    """Skip a test whose real service is missing — but fail under CI (CI=true), where every service
    the suite needs must have been installed and started by .ci/run: a skip there would hide it."""
    import os

    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)


# The clusters and backends the gateway is proven on: (backend, Slurm release). 22.05 is Debian's
# (scripts/cluster up), 25.11 is built from source (scripts/cluster up --slurm 25.11, scripts/pyslurm).
SLURM_TARGETS = (("cli", "22.05"), ("cli", "25.11"), ("pyslurm", "25.11"))
SLURM_TARGET_IDS = [f"{backend}-{release}" for backend, release in SLURM_TARGETS]
DEFAULT_RELEASE = "22.05"

_cluster_env_cache: dict[str, dict[str, str] | str] = {}


def cluster_env(release: str) -> dict[str, str]:
    """``scripts/cluster env --slurm RELEASE`` as a dict (SLURM_CONF, SLURM_CLUSTER, SLURM_BIN_DIR ...);
    skips (fails under CI) when that cluster is not built, e.g. without its source tarball."""
    import subprocess
    from pathlib import Path

    if release not in _cluster_env_cache:
        script = Path(__file__).resolve().parents[1] / "scripts" / "cluster"
        proc = subprocess.run([str(script), "env", "--slurm", release], capture_output=True, text=True, timeout=60)
        if proc.returncode:
            _cluster_env_cache[release] = proc.stderr.strip() or f"scripts/cluster env --slurm {release} failed"
        else:
            _cluster_env_cache[release] = dict(
                line.removeprefix("export ").split("=", 1) for line in proc.stdout.splitlines() if "=" in line
            )
    value = _cluster_env_cache[release]
    if isinstance(value, str):
        skip_unless_ci(f"no Slurm {release} cluster: {value}")
    return value


def slurm_command(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run one of Slurm's commands (``scontrol``, ``sacctmgr``, ...) against the cluster the settings
    point at (``use_slurm_target``): that cluster's binaries and SLURM_CONF. The tests' oracle."""
    from pathlib import Path

    from django.conf import settings

    exe = str(Path(settings.SLURM_BIN_DIR) / argv[0]) if settings.SLURM_BIN_DIR else argv[0]
    env = {**os.environ, **({"SLURM_CONF": settings.SLURM_CONF} if settings.SLURM_CONF else {})}
    return subprocess.run([exe, *argv[1:]], capture_output=True, text=True, env=env, check=check, timeout=timeout)


def use_slurm_target(settings, backend: str, release: str) -> None:
    """Point the portal's settings (and so get_gateway()) at one backend on one local cluster."""
    import portal.slurm as slurm

    if backend == "pyslurm":
        from portal.slurm.pyslurm import pyslurm_version

        if pyslurm_version() is None:
            skip_unless_ci("pyslurm is not installed in this venv (scripts/pyslurm)")
    settings.SLURM_BACKEND = backend
    if release != DEFAULT_RELEASE:
        env = cluster_env(release)
        settings.SLURM_CONF = env["SLURM_CONF"]
        settings.SLURM_CLUSTER = env["SLURM_CLUSTER"]
        settings.SLURM_BIN_DIR = env["SLURM_BIN_DIR"]
    slurm.reset_gateway()



def jobs_that_ran(world) -> dict:
    """Rows for every money, GPU-hours and GPU figure of the API to show something: a rate for a100
    with four places (costs that round), a job and a two-task array job of vision that ran, were
    accounted (usage records, priced slices) and sampled by the GPU monitoring (JobGpuUsage), and an
    approved booking (bookings' GPU-hours and cost, the budget's ``booked``). Needs an inventory with
    partition "gpu" of a100 nodes (``inventory_small``) and enqueues recorded (``relays``,
    ``recorded_tasks``). Returns {"job": …, "array": …, "booking": …}."""
    import dataclasses
    import datetime as dt
    from decimal import Decimal

    from django.utils import timezone

    from accounting.models import Booking, Rate
    from accounting.services import usage_records_upsert
    from jobs.models import Job, JobArrayTask, JobGpuUsage
    from jobs.services import job_submit
    from portal.snapshots import snapshots_forget
    from tests.accounting.helpers import acct

    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("2.3457"), effective_from=dt.date(2020, 1, 1))
    body = job_payload()
    del body["team"]
    job, _ = job_submit(user=world.alice, team=world.vision, **body)
    array, _ = job_submit(user=world.alice, team=world.vision, **{**body, "gpus": 1,
                          "script": "#!/bin/bash\n#SBATCH --array=0-1\ntrue\n"})  # fmt: skip
    start = timezone.now() - dt.timedelta(minutes=50)
    end = start + dt.timedelta(seconds=1234)
    Job.objects.filter(pk=job.pk).update(slurm_job_id=900, slurm_cluster="gpuportal", state="COMPLETED", started_at=start,
                                         ended_at=end)  # fmt: skip
    Job.objects.filter(pk=array.pk).update(slurm_job_id=910, slurm_cluster="gpuportal", state="COMPLETED", started_at=start,
                                           ended_at=end)  # fmt: skip
    job.refresh_from_db()
    array.refresh_from_db()
    records = [acct(start=start, hours=1234 / 3600, gpus=2, job_id=900, comment=job.slurm_tag)]
    for index, seconds in ((0, 1001), (1, 1234)):
        record = acct(start=start, hours=seconds / 3600, gpus=1, job_id=911 + index, comment=array.slurm_tag)
        records.append(dataclasses.replace(record, array_job_id=910, array_tasks=str(index)))
        JobArrayTask.objects.create(job=array, index=index, slurm_job_id=911 + index, state="COMPLETED", exit_code=0,
                                    started_at=start, ended_at=start + dt.timedelta(seconds=seconds))  # fmt: skip
    usage_records_upsert(records=records)
    for owner, slurm_id, task_index, gpu, util in ((job, 900, None, "0", 87.3), (job, 900, None, "1", 12.9),
                                                    (array, 911, 0, "2", 55.5), (array, 912, 1, "3", 3.1)):  # fmt: skip
        JobGpuUsage.objects.create(job=owner, slurm_job_id=slurm_id, task_index=task_index, host="a100-01", gpu=gpu,
                                   model_name="NVIDIA A100", step_seconds=60, samples=20, util_sum=util * 20,
                                   util_peak=min(util * 1.1, 100), idle_samples=3, mem_sum=20 * 1234.5, mem_samples=20,
                                   mem_peak=2000.25, first_at=start, last_at=end, final=True)  # fmt: skip
    window = timezone.now().replace(minute=0, second=0, microsecond=0) + dt.timedelta(hours=5)
    booking = Booking.objects.create(team=world.vision, gpu_type="a100", gpus=1, start=window, end=window + dt.timedelta(minutes=20),
                                     created_by=world.bob, status="approved", approved_at=timezone.now(),
                                     reservation_name="gpuportal-00000000a1a1")  # fmt: skip
    snapshots_forget()  # the rows as a service would have committed them (the booking moves BOOKINGS' version)
    return {"job": job, "array": array, "booking": booking}
