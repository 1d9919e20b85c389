"""A year of a 1 000-GPU site written into a benchmark database of its own (issue 39 item 1).

    eval "$(scripts/services up)"
    BENCH_DB=gpuportal_year .venv/bin/python bench/year_world.py [--scale 0.01] [--seed 39]

The database ``BENCH_DB`` (default gpuportal_year; never the demo's or the tests') on the server of
DATABASE_URL is dropped, created and migrated, then filled the way the portal would have written
twelve months (the calendar months before the current one, UTC) and the current month up to three days
ago (its jobs have all ended; the budget page shows this period) of a site with 1 000 GPUs (80 nodes of 8 A100, 45 of 8 H100):
20 teams, 500 users (a manager per team, a tenth of the users in two teams), an admin and a finance
user; per month and team an approved quota (any type; five teams an H100 quota too), two bookings;
two price changes in the year; and ~3 M Slurm jobs (``--scale`` times that) with what the portal
keeps of each: the Job (its request built by portal.slurm.request.job_request as job_submit stores
it), its events (ACCEPTED, PENDING by the relay, RUNNING and the end by the sync), its budget hold
(released), its array task rows, one usage record per Slurm allocation that started and its slices
(accounting.services.repricing.slice_record: months and rate changes), the job.submit audit event,
and the GPU data as main keeps it (jobs/gpu_summary.py): one JobGpuSummary per ended job that ran
and, for the jobs ended in the last RETENTION_GPU_ROWS_DAYS, the per-GPU JobGpuUsage rows. Rows go in
with COPY (psycopg 3's ``cursor.copy``), month by month, then VACUUM (ANALYZE); the size of every
table (pg_total_relation_size: heap, TOAST, indexes) is printed.

The shape, stated (the local clusters are built fresh with each machine: their sacct holds no
history to draw from; these are bench/bench_gpu_storage.py's "array-heavy site", about 3 M Slurm jobs
filling 1 000 GPUs for a year). GPUs per Slurm job 1/2/4/8: 85/7/5/3 %. Run time log-uniform in
2-60 min (80 %), 1-8 h (15 %), 8-48 h (5 %); the short ones are the tasks of arrays of 10-200 tasks
(log-uniform), one portal job per array. Outcome of a job (or an array) from Slurm's job-state mix
as sites publish it for GPU clusters (e.g. the Philly/Helios traces: most end COMPLETED, a tenth FAIL,
a few percent are cancelled or time out): COMPLETED 72 %, FAILED 12 %, CANCELLED while running 4 %,
CANCELLED while pending 4 % (never ran: no usage, no GPU data), TIMEOUT 5 %, OUT_OF_MEMORY 2 %,
NODE_FAIL 0.5 %, SUBMIT_FAILED 0.5 % (Slurm refused it); in a failed array 30 % of the tasks take the
array's outcome. Queue wait log-uniform 10 s-6 h; time limit the run time x 1.1-3 rounded up to
1, 2, 4, 8, 24 or 48 h (a TIMEOUT ran its whole limit). GPU type asked: A100 65 %, H100 25 %, any
10 % (Slurm then gives an A100 80 % of the time). Teams' sizes and activity uneven (weights 1/k^0.7).
The GPU summaries are encoded from one-minute points (jobs.gpu_summary.summary_encode) for a pool of
jobs of each shape (GPUs x run-time class, arrays by size), each year job storing the record of a
pool job of its shape: encoding three million from their points would take hours; the size per job
is what such a job's record takes."""

from __future__ import annotations

import argparse
import bisect
import datetime as dt
import math
import os
import random
import sys
import time
import uuid
from decimal import Decimal
from pathlib import Path

os.environ.setdefault("BENCH_DB", "gpuportal_year")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import database
from environment import BENCH_DB

MONTHS = 12  # whole months before the current one; then the current month up to CURRENT_UNTIL ago
CURRENT_UNTIL = dt.timedelta(days=3)  # every job of the current month has ended (live jobs: bench_sync.py's)
NOW = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)
YEAR_START = NOW.replace(day=1, hour=0, year=NOW.year - 1)
SLURM_JOBS_A_YEAR = 3_000_000
TEAMS, USERS = 20, 500
NODES = (("a100", 80), ("h100", 45))  # 8 GPUs a node
GPU_COUNTS, GPU_WEIGHTS = (1, 2, 4, 8), (85, 7, 5, 3)
DURATIONS, DURATION_WEIGHTS = ((2, 60), (60, 480), (480, 2880)), (80, 15, 5)
OUTCOMES = (("COMPLETED", 72), ("FAILED", 12), ("CANCELLED", 4), ("PENDING_CANCELLED", 4), ("TIMEOUT", 5),
            ("OUT_OF_MEMORY", 2), ("NODE_FAIL", 0.5), ("SUBMIT_FAILED", 0.5))  # fmt: skip
REASONS = {"FAILED": "NonZeroExitCode", "TIMEOUT": "TimeLimit", "OUT_OF_MEMORY": "OutOfMemory", "NODE_FAIL": "NodeFail",
           "SUBMIT_FAILED": "sbatch: error: Batch job submission failed: Requested node configuration is not available"}  # fmt: skip
LIMITS = (60, 120, 240, 480, 1440, 2880)
NAMES = ("train-resnet50", "finetune-llama", "eval-checkpoint", "sweep-lr", "preprocess-shards", "inference-batch",
         "train-vit", "rl-rollout", "diffusion-sample", "bert-pretrain")  # fmt: skip
PRICES = (("a100", dt.date(2025, 1, 1), "12.0000"), ("a100", dt.date(2026, 6, 1), "10.5000"),
          ("h100", dt.date(2025, 1, 1), "25.0000"), ("h100", dt.date(2026, 4, 1), "22.0000"))  # fmt: skip
SCRIPT = "#!/bin/bash\n#SBATCH --cpus-per-gpu=8\nsource ~/venv/bin/activate\npython {name}.py --config configs/{n}.yaml\n"


# ---------------------------------------------------------------- COPY


def copy_rows(model, objs, *, values: bool = False) -> int:
    """Insert model instances as they are (every concrete column, the primary key included, no
    auto_now_add: the year's timestamps stay) with one COPY; JSON fields through Django's preparation.
    ``values``: the rows are tuples of the columns' values in the model's order (the tables of
    millions of plain rows: building a model instance a row doubled the load's time)."""
    from django.db import connection, models

    if not objs:
        return 0
    fields = model._meta.concrete_fields
    prepared = [isinstance(f, models.JSONField) for f in fields]
    qn = connection.ops.quote_name
    columns = ", ".join(qn(f.column) for f in fields)
    names = [f.attname for f in fields]
    with (
        connection.cursor() as cursor,
        cursor.cursor.copy(f"COPY {qn(model._meta.db_table)} ({columns}) FROM STDIN") as copy,
    ):
        if values:
            for row in objs:
                copy.write_row(row)
            return len(objs)
        for obj in objs:
            copy.write_row([f.get_db_prep_save(getattr(obj, n), connection) if p else getattr(obj, n)
                            for f, n, p in zip(fields, names, prepared, strict=True)])  # fmt: skip
    return len(objs)


def sequences_reset(models_) -> None:
    """After explicit ids: each table's id sequence past its largest id (what the next insert needs)."""
    from django.core.management.color import no_style
    from django.db import connection

    with connection.cursor() as cursor:
        for sql in connection.ops.sequence_reset_sql(no_style(), models_):
            cursor.execute(sql)


# ---------------------------------------------------------------- the site


class Site:
    """Teams, users, rates, quotas and bookings (small: through the ORM), and what the job rows need
    of them."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def build(self) -> None:
        self._people()
        self._inventory()
        self._rates()
        self._quotas()
        self._bookings()

    def _people(self) -> None:
        from django.contrib.auth import get_user_model
        from django.contrib.auth.hashers import make_password
        from django.contrib.auth.models import Permission

        from portal.models import Membership, Profile, Role, Team

        User = get_user_model()
        at = YEAR_START - dt.timedelta(days=30)
        Team.objects.bulk_create([Team(name=f"Team {k + 1:02d}", slug=f"team-{k + 1:02d}", slurm_account=f"team{k + 1:02d}",
                                       created_at=at) for k in range(TEAMS)])  # fmt: skip
        self.teams = list(Team.objects.order_by("slug"))
        unusable = make_password(None)
        User.objects.bulk_create([User(username=f"user{i:03d}", email=f"user{i:03d}@example.org", password=unusable,
                                       date_joined=at) for i in range(USERS)])  # fmt: skip
        self.users = list(User.objects.filter(username__startswith="user").order_by("username"))
        admin = User.objects.create_superuser("year-admin", "admin@example.org", None)
        finance = User.objects.create_user("year-finance", "finance@example.org", None)
        finance.user_permissions.add(Permission.objects.get(codename="view_cost_reports"))
        Profile.objects.bulk_create([Profile(user=u) for u in [*self.users, admin, finance]])
        self.members: dict[int, list] = {team.pk: [] for team in self.teams}
        rows = []
        for i, user in enumerate(self.users):
            homes = [self.teams[i % TEAMS]] + ([self.teams[(i + 7) % TEAMS]] if i % 10 == 9 else [])
            for team in homes:
                role = Role.MANAGER if i < TEAMS else Role.MEMBER
                rows.append(Membership(team=team, user=user, role=role, created_at=at))
                self.members[team.pk].append((user, 10_000 + i))
        Membership.objects.bulk_create(rows)
        self.team_weights = [1 / (k + 1) ** 0.7 for k in range(TEAMS)]
        self.admin, self.finance = admin, finance

    def _inventory(self) -> None:
        from django.utils import timezone

        from portal.models import NodeInfo, PartitionInfo
        from portal.slurm import cluster_config

        self.cluster_name = cluster_config().name
        from portal.models import Cluster

        self.cluster = Cluster.objects.get(name=self.cluster_name)
        now = timezone.now()
        nodes = [f"{gpu_type}-{n:03d}" for gpu_type, count in NODES for n in range(count)]
        PartitionInfo.objects.update_or_create(
            cluster=self.cluster,
            name="gpu",
            defaults=dict(  # noqa: C408
                is_default=True,
                state="UP",
                default_time_minutes=60,
                max_time_minutes=2880,
                node_names=nodes,
                seen_at=now,
            ),
        )
        NodeInfo.objects.bulk_create([
            NodeInfo(cluster=self.cluster, name=name, state="MIXED", partitions=["gpu"], gpu_type=name[:4], gpus_total=8,
                     gpus_allocated=6, cpus_total=128, cpus_allocated=48, memory_mb=1_024_000, seen_at=now)
            for name in nodes
        ])  # fmt: skip

    def _rates(self) -> None:
        from accounting.models import Rate
        from accounting.rates import RateBook

        Rate.objects.bulk_create([Rate(gpu_type=t, price_per_gpu_hour=Decimal(p), currency="CNY", effective_from=d,
                                       created_by=self.admin) for t, d, p in PRICES])  # fmt: skip
        self.book = RateBook.load()

    def price(self, gpu_type: str, at: dt.datetime) -> Decimal:
        rate = self.book.rate_at(gpu_type or "a100", "gpu", at)
        return rate.price_per_gpu_hour

    def _quotas(self) -> None:
        from accounting.models import Quota, QuotaState

        rows = []
        for m in range(MONTHS + 1):
            start = month(m).date()
            end = month(m + 1).date()
            for k, team in enumerate(self.teams):
                hours = Decimal(round(720_000 * self.team_weights[k] / sum(self.team_weights), -2))
                decided = month(m) - dt.timedelta(days=3)
                common = dict(
                    team=team,
                    period_start=start,
                    period_end=end,
                    state=QuotaState.APPROVED,  # noqa: C408
                    requested_by=self.members[team.pk][0][0],
                    requested_at=decided - dt.timedelta(days=2),
                    decided_by=self.admin,
                    decided_at=decided,
                    approved_at=decided,
                    slurm_mirrored_at=decided,
                )
                rows.append(Quota(gpu_type="", gpu_hours=hours, justification="monthly allocation", **common))
                if k < 5:
                    rows.append(
                        Quota(gpu_type="h100", gpu_hours=hours / 4, justification="H100 share", **common)
                    )
        Quota.objects.bulk_create(rows)

    def _bookings(self) -> None:
        from accounting.models import Booking, BookingStatus, ReservationState

        rows = []
        rng = self.rng
        for m in range(MONTHS + 1):
            for team in self.teams:
                for _ in range(2):
                    start = month(m) + dt.timedelta(days=rng.randrange(27), hours=rng.randrange(24))
                    end = start + dt.timedelta(hours=rng.choice((12, 24, 48, 72)))
                    cancelled = rng.random() < 0.1
                    created = start - dt.timedelta(days=rng.randrange(1, 10))
                    booking_id = uuid.UUID(int=rng.getrandbits(128), version=4)
                    rows.append(Booking(
                        id=booking_id, team=team, cluster=self.cluster, gpu_type=rng.choice(("a100", "a100", "h100")),
                        gpus=rng.choice((8, 16, 24)), start=start, end=end, note="workshop",
                        status=BookingStatus.CANCELLED if cancelled else BookingStatus.APPROVED,
                        created_by=self.members[team.pk][0][0], created_at=created, decided_by=self.admin,
                        decided_at=created + dt.timedelta(hours=2), approved_at=created + dt.timedelta(hours=2),
                        cancelled_at=start - dt.timedelta(hours=1) if cancelled else None,
                        reservation_name=Booking.reservation_name_for(booking_id),
                        reservation_state=ReservationState.DELETED if end < NOW or cancelled else ReservationState.ACTIVE,
                        reservation_updated_at=min(end, NOW),
                    ))  # fmt: skip
        copy_rows(Booking, rows)
        self.bookings: dict[tuple[int, str], list] = {}
        for b in sorted((b for b in rows if b.status == BookingStatus.APPROVED), key=lambda b: b.start):
            self.bookings.setdefault((b.team_id, b.gpu_type), []).append(b)

    def booking_at(self, team_id: int, gpu_type: str, at: dt.datetime):
        """The team's approved booking of this type whose window holds ``at`` (None: none)."""
        rows = self.bookings.get((team_id, gpu_type), [])
        i = bisect.bisect_right([b.start for b in rows], at) - 1
        return rows[i] if i >= 0 and rows[i].end > at else None


def month(m: int) -> dt.datetime:
    year, index = divmod(YEAR_START.month - 1 + m, 12)
    return YEAR_START.replace(year=YEAR_START.year + year, month=index + 1)


# ---------------------------------------------------------------- the jobs' shapes


def log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def outcome(rng: random.Random) -> str:
    return rng.choices([o for o, _ in OUTCOMES], weights=[w for _, w in OUTCOMES])[0]


def time_limit(rng: random.Random, minutes: int) -> int:
    wanted = minutes * rng.uniform(1.1, 3)
    return next((limit for limit in LIMITS if limit >= wanted), LIMITS[-1])


class Shape:
    """One portal job as Slurm ran it: GPUs a task, and per task (run minutes, start offset in minutes)."""

    def __init__(self, gpus: int, tasks: list[tuple[int, int]], array: bool, duration_class: int):
        self.gpus, self.tasks, self.array, self.duration_class = gpus, tasks, array, duration_class


def draw_shape(rng: random.Random) -> Shape:
    gpus = rng.choices(GPU_COUNTS, weights=GPU_WEIGHTS)[0]
    # DURATION_WEIGHTS are per Slurm job: a short one comes as one of an array's ~63 tasks
    duration_class = rng.choices(range(3), weights=PORTAL_JOB_WEIGHTS)[0]
    low, high = DURATIONS[duration_class]
    if duration_class:
        return Shape(gpus, [(round(log_uniform(rng, low, high)), 0)], False, duration_class)
    size = round(log_uniform(rng, 10, 200))
    return Shape(
        gpus,
        [(max(2, round(log_uniform(rng, low, high))), round(i * rng.uniform(0, 3))) for i in range(size)],
        True,
        0,
    )


# the mean size of an array (log-uniform 10-200): (200 - 10) / ln 20 = 63.4 tasks
PORTAL_JOB_WEIGHTS = (DURATION_WEIGHTS[0] / ((200 - 10) / math.log(20)), *DURATION_WEIGHTS[1:])
ARRAY_SIZES = (10, 14, 20, 28, 40, 56, 80, 113, 160, 200)


class SummaryPool:
    """Encoded GPU records (jobs.gpu_summary.summary_encode of one-minute points, as the finalisation
    writes them) of ``per_shape`` jobs of each shape: GPUs x run-time class for single jobs, GPUs x
    array size (ARRAY_SIZES) for arrays."""

    def __init__(self, rng: random.Random, *, per_shape: int):
        from bench_gpu_storage import _points
        from django.conf import settings

        from jobs.gpu_summary import summary_encode
        from jobs.models import JobGpuUsage

        self.pool: dict[tuple, list[bytes]] = {}
        start = YEAR_START
        for gpus in GPU_COUNTS:
            keys = [("single", gpus, c) for c in (1, 2)] + [("array", gpus, s) for s in ARRAY_SIZES]
            for key in keys:
                for _ in range(per_shape):
                    if key[0] == "single":
                        low, high = DURATIONS[key[2]]
                        tasks = [(round(log_uniform(rng, low, high)), 0)]
                    else:
                        tasks = [
                            (max(2, round(log_uniform(rng, 2, 60))), round(i * rng.uniform(0, 3)))
                            for i in range(key[2])
                        ]
                    rows, points = [], {}
                    for index, (minutes, offset) in enumerate(tasks):
                        for g in range(gpus):
                            series = _points(rng, start=start + dt.timedelta(minutes=offset), minutes=minutes)
                            util = [u for _, u, _ in series]
                            mem = [m for _, _, m in series]
                            points[len(rows)] = series
                            rows.append(JobGpuUsage(
                                task_index=index if key[0] == "array" else None, slurm_job_id=9_000_000 + index,
                                host=f"{'a100' if g % 5 else 'h100'}-{rng.randrange(80):03d}", gpu=str(g),
                                model_name="NVIDIA A100-SXM4-80GB", step_seconds=60, samples=len(series), util_sum=sum(util),
                                util_peak=max(util), idle_samples=sum(1 for u in util if u < 5), mem_sum=sum(mem),
                                mem_samples=len(mem), mem_peak=max(mem), first_at=series[0][0], last_at=series[-1][0], final=True,
                            ))  # fmt: skip
                    data = summary_encode(rows, points, minimum_width=settings.GPU_SERIES_MIN_BUCKET_SECONDS)
                    self.pool.setdefault(key, []).append(data)

    def record(self, rng: random.Random, shape: Shape) -> bytes:
        if shape.array:
            size = min(ARRAY_SIZES, key=lambda s: abs(math.log(s) - math.log(len(shape.tasks))))
            return rng.choice(self.pool[("array", shape.gpus, size)])
        return rng.choice(self.pool[("single", shape.gpus, shape.duration_class)])


# ---------------------------------------------------------------- a month of jobs


class Ids:
    """Explicit ids of the tables with a database sequence (reset after the load), from ``base`` + 1:
    each month its own range, so that months are written side by side."""

    def __init__(self, base: int = 0):
        self.base, self.next = base, {}

    def take(self, name: str, count: int = 1) -> int:
        first = self.next.get(name, self.base + 1)
        self.next[name] = first + count
        return first


class Month:
    """The rows of one month's jobs, written table by table with COPY."""

    def __init__(self):
        self.jobs, self.events, self.holds, self.tasks, self.records, self.slices = [], [], [], [], [], []
        self.summaries, self.audit, self.gpu_rows = [], [], []

    def write(self) -> int:
        from accounting.models import BudgetHold, UsageRecord, UsageSlice
        from jobs.models import Job, JobArrayTask, JobEvent, JobGpuSummary, JobGpuUsage
        from portal.models import AuditEvent

        jobs = copy_rows(Job, self.jobs)
        tuples = copy_rows(JobEvent, self.events, values=True) + copy_rows(
            JobArrayTask, self.tasks, values=True
        )
        return jobs + tuples + sum(copy_rows(model, rows) for model, rows in (
            (BudgetHold, self.holds), (UsageRecord, self.records), (UsageSlice, self.slices),
            (JobGpuSummary, self.summaries), (AuditEvent, self.audit), (JobGpuUsage, self.gpu_rows)))  # fmt: skip


class Year:
    def __init__(self, site: Site, pool: SummaryPool, *, seed: int, scale: float):
        from django.conf import settings

        self.site, self.pool, self.seed, self.scale = site, pool, seed, scale
        self.gpu_rows_from = NOW - dt.timedelta(days=settings.RETENTION_GPU_ROWS_DAYS)

    def month(self, m: int) -> Month:
        """Month ``m``'s jobs (MONTHS: the current month up to CURRENT_UNTIL ago), at the year's rate;
        its own random stream, ids and Slurm ids (months are written side by side)."""
        self.rng = random.Random(self.seed * 1000 + m)
        self.ids = Ids(base=m * 10**9)
        self.slurm_id = 1_000_000 + m * 10_000_000
        self.counts = {"portal jobs": 0, "Slurm jobs": 0, "usage records": 0}
        rows = Month()
        begin = month(m)
        span = ((NOW - CURRENT_UNTIL) if m == MONTHS else month(m + 1)) - begin
        target = SLURM_JOBS_A_YEAR * self.scale * span / dt.timedelta(days=365)
        done = 0
        while done < target:
            shape = draw_shape(self.rng)
            done += len(shape.tasks)
            self.job(rows, shape, begin + self.rng.uniform(0, 1) * span)
        rows.jobs.sort(key=lambda j: j.created_at)  # the portal inserts them in time order
        return rows

    def job(self, rows: Month, shape: Shape, at: dt.datetime) -> None:
        from accounting.models import BudgetHold
        from jobs.models import Job
        from portal import money
        from portal.services import audit_event

        rng, site = self.rng, self.site
        team = rng.choices(site.teams, weights=site.team_weights)[0]
        user, uid = rng.choice(site.members[team.pk])
        asked = rng.choices(("a100", "h100", ""), weights=(65, 25, 10))[0]
        given = asked or rng.choices(("a100", "h100"), weights=(80, 20))[0]
        end_state = outcome(rng)
        longest = max(m for m, _ in shape.tasks)
        limit = time_limit(rng, longest)
        name = rng.choice(NAMES)
        job_id = uuid.UUID(int=rng.getrandbits(128), version=4)
        array = f"0-{len(shape.tasks) - 1}" if shape.array else ""
        workdir = f"/home/{user.username}/work/{name}"
        price = site.price(given, at)
        estimate = shape.gpus * limit * 60 * len(shape.tasks)
        booking = site.booking_at(team.pk, given, at) if not shape.array and rng.random() < 0.5 else None
        job = Job(
            id=job_id, team=team, submitter=user, cluster=site.cluster, name=name,
            script=SCRIPT.format(name=name.split("-")[0], n=rng.randrange(1000)), partition="gpu", gpu_type=asked,
            gpus=shape.gpus, time_limit_minutes=limit, workdir=workdir, submit_dir=workdir, array=array,
            array_tasks=len(shape.tasks), booking=booking, state=end_state.replace("PENDING_", ""), created_at=at,
            estimated_gpu_seconds=estimate, estimated_gpu_hours=money.stored(money.gpu_hours(estimate), up=True),
            estimated_cost=money.stored(money.cost(gpu_seconds=estimate, price=price), up=True), currency="CNY",
            relay_attempts=1, unix_uid=uid, request_fingerprint=f"{rng.getrandbits(256):064x}",
        )  # fmt: skip
        job.output_pattern, job.error_pattern, job.request = request_of(job)
        events = [(JobState_ACCEPTED, "Accepted by the portal", at)]
        submitted = at + dt.timedelta(seconds=rng.uniform(0.2, 3))
        if end_state == "SUBMIT_FAILED":
            job.state_reason = job.last_relay_error = REASONS[end_state]
            job.ended_at = submitted
            events.append(("SUBMIT_FAILED", job.state_reason, submitted))
        else:
            job.slurm_cluster, job.slurm_job_id, job.submitted_at = (
                site.cluster_name,
                self.slurm_id,
                submitted,
            )
            self.slurm_id += len(shape.tasks) + 1 if shape.array else 1
            events.append(("PENDING", "Submitted to Slurm", submitted))
            start = submitted + dt.timedelta(seconds=log_uniform(rng, 10, 6 * 3600))
            if end_state == "PENDING_CANCELLED":
                job.ended_at = job.cancel_requested_at = job.cancel_sent_at = start
                events.append(("CANCELLED", "", start))
            else:
                self.ran(rows, job, shape, start, end_state, given, events, limit)
            job.end_notified_at = job.ended_at + dt.timedelta(seconds=30)
        job.state_reason = job.state_reason or REASONS.get(job.state, "")
        rows.jobs.append(job)
        for state, reason, when in events:
            rows.events.append((self.ids.take("event"), job_id, state, reason, when))  # JobEvent's columns
        hours = money.stored(money.gpu_hours(shape.gpus * limit * 60), up=True)
        rows.holds.append(BudgetHold(
            job_uuid=job_id, team=team, gpu_type=asked or "a100,h100", booking=booking,
            estimated_gpu_hours=job.estimated_gpu_hours, estimated_cost=job.estimated_cost, tasks=len(shape.tasks),
            task_gpu_hours=hours, held_gpu_hours=Decimal(0), slurm_cluster=job.slurm_cluster, slurm_job_id=job.slurm_job_id,
            created_at=at, released_at=(job.ended_at or at) + dt.timedelta(minutes=rng.uniform(1, 10)),
        ))  # fmt: skip
        audit = audit_event(actor=user, action="job.submit", target=job, team=team, data={
            "name": job.name, "partition": job.partition, "gpu_type": job.gpu_type, "gpus": job.gpus,
            "time_limit_minutes": job.time_limit_minutes})  # fmt: skip
        audit.id, audit.at, audit.address = self.ids.take("audit"), at, f"10.20.0.{rng.randrange(1, 250)}"
        rows.audit.append(audit)
        self.counts["portal jobs"] += 1

    def ran(
        self,
        rows: Month,
        job,
        shape: Shape,
        start: dt.datetime,
        end_state: str,
        given: str,
        events: list,
        limit: int,
    ) -> None:
        """What a job that started left: its tasks, records and slices, its GPU record, the RUNNING and end events."""
        from accounting.models import UsageRecord
        from accounting.services.repricing import slice_record
        from jobs.models import JobGpuSummary
        from portal import money
        from portal.slurm.tags import slurm_tag

        rng = self.rng
        failing = end_state != "COMPLETED"
        ends = []
        for index, (minutes, offset) in enumerate(shape.tasks):
            task_state = end_state if not shape.array or (failing and rng.random() < 0.3) else "COMPLETED"
            if task_state == "TIMEOUT":
                minutes = limit
            elif task_state in ("CANCELLED", "NODE_FAIL", "FAILED", "OUT_OF_MEMORY"):
                minutes = max(1, round(minutes * rng.uniform(0.05, 1)))
            task_start = start + dt.timedelta(minutes=offset)
            task_end = task_start + dt.timedelta(minutes=minutes, seconds=rng.randrange(60))
            ends.append(task_end)
            slurm_id = job.slurm_job_id + index + 1 if shape.array else job.slurm_job_id
            if shape.array:
                rows.tasks.append(
                    (
                        self.ids.take("task"),
                        job.id,
                        index,
                        slurm_id,
                        task_state,  # JobArrayTask's columns
                        0 if task_state == "COMPLETED" else 1,
                        task_start,
                        task_end,
                        None,  # cancel_requested_at: no task cancelled alone
                    )
                )
            seconds = int((task_end - task_start).total_seconds())
            gpu_seconds = shape.gpus * seconds
            record = UsageRecord(
                id=self.ids.take("record"), cluster=job.slurm_cluster, job_id=slurm_id, submit_time=job.submitted_at,
                start_time=task_start, end_time=task_end, state=task_state, name=job.name, account=job.team.slurm_account,
                team=job.team, unix_user=job.submitter.username, user=job.submitter, partition="gpu", num_nodes=1,
                comment=slurm_tag(job.id), portal_job_uuid=job.id, booking=job.booking, gpus=shape.gpus, gpu_type=given,
                elapsed_seconds=seconds, time_limit_minutes=limit, gpu_seconds=gpu_seconds,
                gpu_hours=money.stored(money.gpu_hours(gpu_seconds)),
                requested_gpu_hours=money.stored(money.gpu_hours(max(shape.gpus * limit * 60, gpu_seconds))),
                gpu_busy_fraction=Decimal(rng.choice(("0.050000", "0.310000", "0.620000", "0.930000"))),
                known_until=task_end, first_seen_at=task_end + dt.timedelta(minutes=rng.uniform(1, 10)),
            )  # fmt: skip
            rows.records.append(record)
            for piece in slice_record(record, self.site.book):
                piece.id = self.ids.take("slice")
                rows.slices.append(piece)
            self.counts["usage records"] += 1
        self.counts["Slurm jobs"] += len(shape.tasks)
        job.started_at, job.ended_at = start, max(ends)
        job.exit_code = 0 if end_state == "COMPLETED" else 1
        if end_state == "CANCELLED":
            job.cancel_requested_at = job.cancel_sent_at = job.ended_at
        events.append(("RUNNING", "", start + dt.timedelta(seconds=rng.uniform(0, 60))))
        events.append(
            (job.state, REASONS.get(job.state, ""), job.ended_at + dt.timedelta(seconds=rng.uniform(0, 60)))
        )
        rows.summaries.append(
            JobGpuSummary(job_id=job.id, ended_at=job.ended_at, data=self.pool.record(rng, shape))
        )
        if job.ended_at >= self.gpu_rows_from:
            self.gpu_rows(rows, job, shape)

    def gpu_rows(self, rows: Month, job, shape: Shape) -> None:
        """The per-GPU working rows kept RETENTION_GPU_ROWS_DAYS after the end (as the record says)."""
        from jobs.gpu_summary import summary_decode

        usage, _chart = summary_decode(rows.summaries[-1].data, job_id=job.id)
        for row in usage:
            row.id = self.ids.take("gpu_row")
            rows.gpu_rows.append(row)


JobState_ACCEPTED = "ACCEPTED"


def request_of(job) -> tuple[str, str, dict]:
    """(output pattern, error pattern, request) as job_submit stores them for a job asked with these
    fields: its name, partition, GPUs, time limit, output file, array, account and tag on the command
    line (tests/support.py ``stored_request`` builds the same)."""
    from jobs.spec import output_files
    from portal.slurm.request import job_request
    from portal.slurm.tags import slurm_tag

    output, error = output_files(workdir=job.workdir, array=job.array)
    command_line = [("job-name", job.name), ("partition", job.partition), ("chdir", job.workdir),
                    ("gres", f"gpu:{job.gpu_type}:{job.gpus}" if job.gpu_type else f"gpu:{job.gpus}"),
                    ("time", str(job.time_limit_minutes)), ("output", output)]  # fmt: skip
    command_line += [("error", error)] if error else []
    command_line += [("array", job.array)] if job.array else []
    command_line += [("account", job.team.slurm_account), ("comment", slurm_tag(job.id))]
    request = job_request(script=job.script, command_line=command_line, workdir=job.workdir, submit_dir=job.submit_dir,
                          gpus=job.gpus, gpu_type=job.gpu_type, time_limit_minutes=job.time_limit_minutes,
                          array_tasks=job.array_tasks)  # fmt: skip
    return output, error, request.to_json()


# ---------------------------------------------------------------- the totals, the sizes, the command


def budget_totals(site: Site) -> int:
    """The running totals the budget check keeps per quota key (team, type, period): used = the
    period's ingested GPU-seconds and GPU-hours (usage inside bookings left out when they charge their reserved hours),
    held 0 (every hold released). One INSERT … SELECT over the slices."""
    from django.db import connection

    from accounting.charging import bookings_charge_reserved
    from accounting.models import BudgetTotal, Quota, UsageRecord, UsageSlice

    booked = "AND r.booking_id IS NULL" if bookings_charge_reserved() else ""
    with connection.cursor() as cursor:
        cursor.execute(f"""
            INSERT INTO {BudgetTotal._meta.db_table} (team_id, gpu_type, period_start, period_end, ends_at,
                                                      held_gpu_hours, used_gpu_seconds, used_gpu_hours, updated_at)
            SELECT team_id, gpu_type, period_start, period_end, ends_at, 0, used, round(used / 3600, 6), ends_at FROM (
                SELECT q.team_id, q.gpu_type, q.period_start, q.period_end, q.period_end::timestamp AT TIME ZONE %s AS ends_at,
                       COALESCE((SELECT SUM(s.gpu_seconds) FROM {UsageSlice._meta.db_table} s
                                 JOIN {UsageRecord._meta.db_table} r ON r.id = s.record_id
                                 WHERE s.team_id = q.team_id AND s.period = q.period_start
                                   AND (q.gpu_type = '' OR s.gpu_type = q.gpu_type) {booked}), 0) AS used
                FROM {Quota._meta.db_table} q WHERE q.state = 'approved'
            ) AS totals
        """, ["UTC"])  # fmt: skip
        return cursor.rowcount


def sizes() -> list[tuple[str, int, int]]:
    """(table, rows estimated by the statistics, pg_total_relation_size) of every table, largest first."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT c.relname, c.reltuples::bigint, pg_total_relation_size(c.oid) FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE c.relkind = 'r' AND n.nspname = 'public' ORDER BY 3 DESC
        """)
        return cursor.fetchall()


_YEAR: Year | None = None  # the year the forked writers share (site, pool)
BIG_TABLES = ("jobs_job", "jobs_jobevent", "jobs_jobarraytask", "accounting_usagerecord", "accounting_usageslice",
              "accounting_budgethold", "portal_auditevent", "jobs_jobgpuusage")  # fmt: skip


def _write_month(m: int) -> tuple[int, int, dict, float]:
    began = time.perf_counter()
    written = _YEAR.month(m).write()
    return m, written, dict(_YEAR.counts), time.perf_counter() - began


def indexes_drop() -> list[str]:
    """Drop the big tables' indexes that back no constraint (the load then builds each once, sorted,
    instead of updating it row by row; the result is the same index); their definitions to rebuild."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT indexname, indexdef FROM pg_indexes i WHERE schemaname = 'public' AND tablename = ANY(%s)
                          AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)""",
            [list(BIG_TABLES)],
        )
        found = cursor.fetchall()
        for name, _definition in found:
            cursor.execute(f'DROP INDEX "{name}"')
    return [definition for _name, definition in found]


def main() -> None:
    global _YEAR
    import multiprocessing

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scale", type=float, default=1.0, help="share of the year's jobs (0.01: 30 000 Slurm jobs)"
    )
    parser.add_argument("--seed", type=int, default=39)
    parser.add_argument("--workers", type=int, default=2, help="months written side by side (processes)")
    args = parser.parse_args()
    began = time.perf_counter()
    database.setup(fresh=True, year=True)
    from django.db import connection, connections

    from accounting.models import UsageRecord, UsageSlice
    from jobs.models import JobArrayTask, JobEvent, JobGpuUsage
    from portal.models import AuditEvent

    rng = random.Random(args.seed)
    site = Site(rng)
    site.build()
    pool = SummaryPool(rng, per_shape=8 if args.scale >= 0.5 else 3)
    _YEAR = Year(site, pool, seed=args.seed, scale=args.scale)
    definitions = indexes_drop()
    print(f"{BENCH_DB}: site and GPU-record pool ready in {time.perf_counter() - began:.0f} s", flush=True)
    connections.close_all()  # each writer opens its own
    counts: dict[str, int] = {}
    with multiprocessing.get_context("fork").Pool(args.workers) as writers:
        for m, written, month_counts, seconds in writers.imap_unordered(_write_month, range(MONTHS + 1)):
            counts = {k: counts.get(k, 0) + v for k, v in month_counts.items()}
            print(
                f"  {month(m):%Y-%m}: {written:,} rows in {seconds:.0f} s ({time.perf_counter() - began:.0f} s)",
                flush=True,
            )
    indexed = time.perf_counter()
    with connection.cursor() as cursor:
        for definition in definitions:
            cursor.execute(definition)
    print(f"  {len(definitions)} indexes built in {time.perf_counter() - indexed:.0f} s", flush=True)
    sequences_reset([JobEvent, JobArrayTask, UsageRecord, UsageSlice, AuditEvent, JobGpuUsage])
    totals = budget_totals(site)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE)")  # what autovacuum does after the inserts
    database.year_mark()  # the benchmarks that empty or drop BENCH_DB now refuse it
    print(
        f"\n{BENCH_DB}: {', '.join(f'{v:,} {k}' for k, v in counts.items())}, {totals} budget totals; "
        f"{time.perf_counter() - began:.0f} s\n"
    )
    table = sizes()
    print(f"{'table':<36} {'rows':>12} {'size':>12}")
    for name, rows, size in table:
        if size >= 64 * 1024:
            print(f"{name:<36} {rows:>12,} {size / 2**20:>9,.1f} MiB")
    print(f"{'database':<36} {'':>12} {sum(s for _, _, s in table) / 2**30:>9,.2f} GiB")


if __name__ == "__main__":
    main()
