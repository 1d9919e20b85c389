"""Jobs (persisted before they reach Slurm), their state history, and reusable job templates."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.contrib.postgres.indexes import BrinIndex
from django.db.models import F, Q

from portal import models as portal_models
from portal.slurm import tags

from jobs.choices import LIVE_STATES, JobState, TemplateScope, TERMINAL_STATES


class Job(models.Model):
    """One batch job. Stored ACCEPTED by ``job_submit``, sent to Slurm by the ``job_relay`` task,
    followed by ``jobs_sync``. State changes only through services and tasks (conditional updates)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of their own: job_team_created_id and job_submitter_created_id begin with them and
    # serve every lookup by team or submitter (a second index was one more write per submission and
    # ~7 MB per million jobs each: migration 0024)
    team = models.ForeignKey("portal.Team", on_delete=models.PROTECT, related_name="jobs", db_index=False)
    submitter = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs", db_index=False)
    # The cluster it runs on, chosen at submission (from the partition, or the request's `cluster`);
    # ``slurm_cluster`` is the name Slurm gave with its id (the same cluster's name).
    cluster = models.ForeignKey("portal.Cluster", on_delete=models.PROTECT, related_name="jobs",
                                default=portal_models.default_cluster_id)  # fmt: skip

    # What was asked for
    name = models.CharField(max_length=128)
    script = models.TextField()
    partition = models.CharField(max_length=64)
    gpu_type = models.CharField(max_length=32, blank=True, help_text="Empty: any GPU type.")
    gpus = models.PositiveIntegerField()
    nodes = models.PositiveIntegerField(default=1)
    cpus_per_gpu = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: not asked for (Slurm's default).")
    memory_gb = models.PositiveIntegerField(null=True, blank=True, help_text="Per node; empty: partition default.")
    time_limit_minutes = models.PositiveIntegerField()
    workdir = models.CharField(max_length=1024)
    # where it was submitted from (SLURM_SUBMIT_DIR, the base of relative paths; jobs/workdirs.py)
    submit_dir = models.CharField(max_length=1024)
    environment = models.JSONField(default=dict, blank=True)
    # What the script's #SBATCH lines and the fields asked for (jobs.spec): ``gpus`` is what Slurm
    # allocates to one job (one array task); the estimate is gpus × time limit × array_tasks.
    ntasks = models.PositiveIntegerField(default=1)
    cpus_per_task = models.PositiveIntegerField(null=True, blank=True)
    exclusive = models.BooleanField(default=False)
    array = models.CharField(max_length=256, blank=True, help_text="sbatch --array, e.g. 0-15%4; empty: not an array.")
    array_tasks = models.PositiveIntegerField(default=1)
    array_throttle = models.PositiveIntegerField(null=True, blank=True)
    qos = models.CharField(max_length=64, blank=True)
    constraint = models.CharField(max_length=1024, blank=True)
    output_pattern = models.CharField(max_length=1024, help_text="Where stdout goes (absolute): the script's --output, else the portal's.")
    error_pattern = models.CharField(max_length=1024, blank=True, help_text="Where stderr goes (absolute); empty: with stdout.")
    # What Slurm gets (portal.slurm.types.JobRequest.to_json): built once at submission from the
    # script and the fields (jobs.spec), handed to the gateway unchanged by the relay.
    request = models.JSONField(default=dict, blank=True)
    # the jobs it waits for (the ``depends_on`` field): sent to Slurm as --dependency=afterok on their
    # Slurm ids once each has one (jobs.dependencies)
    depends_on = models.ManyToManyField("self", symmetrical=False, through="JobDependency", related_name="dependents", blank=True)
    # The booking the job runs in (its Slurm reservation); bookings are never deleted (cancelled).
    booking = models.ForeignKey("accounting.Booking", null=True, blank=True, on_delete=models.PROTECT, related_name="jobs")

    # Where it is
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.ACCEPTED)
    state_reason = models.CharField(max_length=1024, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_sent_at = models.DateTimeField(null=True, blank=True)  # scancel succeeded (sweeper re-sends otherwise)
    # why the portal itself cancels it (the idle-GPU policy): put into Slurm's AdminComment before the
    # scancel, and the reason of its CANCELLED event; empty: a person's cancel
    cancel_reason = models.CharField(max_length=255, blank=True)
    # exempt from its team's idle-GPU policy (a debugger session), chosen at submission; its managers see it
    idle_exempt = models.BooleanField(default=False)
    # While pending (jobs_sync, from its one queue read; jobs.pending): the scheduler's expected start
    # (null: no estimate yet), the place among the pending jobs of its partition wanting the same GPU
    # type (1 = next), and the estimate before the last move of more than START_ESTIMATE_MOVE_MINUTES.
    expected_start_at = models.DateTimeField(null=True, blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    expected_start_moved_from = models.DateTimeField(null=True, blank=True)
    slurm_cluster = models.CharField(max_length=64, blank=True)
    slurm_job_id = models.PositiveBigIntegerField(null=True, blank=True)
    unix_uid = models.IntegerField(null=True, blank=True)  # the Unix user the job runs as (output owner check)
    exit_code = models.IntegerField(null=True, blank=True)
    # the signal that ended it, as sacct's ExitCode "0:9" gives it (9); 0: none; None: not known (yet)
    exit_signal = models.IntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    submitted_at = models.DateTimeField(null=True, blank=True)  # Slurm gave it an id
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # The first queue read that no longer showed this started job while its accounting had no end (a
    # controller that forgot it in a takeover: jobs.services.sync); cleared if the queue shows it again
    gone_from_queue_at = models.DateTimeField(null=True, blank=True)
    # The job-end e-mail was dealt with (sent, or not wanted: the submitter had not opted in), set by
    # the claim that decides it (jobs.services.job_end_notify_send). Null on an ended job that
    # reached Slurm: its notice is owed (the sweeper's, jobs.services.job_end_notify_sweep).
    end_notified_at = models.DateTimeField(null=True, blank=True)

    # Estimate at submission: the most Slurm can charge (jobs.estimate), exact in GPU-seconds; hours
    # and cost to six places rounded up (pages and the API round them for display)
    estimated_gpu_seconds = models.PositiveBigIntegerField(default=0)
    estimated_gpu_hours = models.DecimalField(max_digits=16, decimal_places=6)
    estimated_cost = models.DecimalField(max_digits=18, decimal_places=6, null=True, blank=True)
    currency = models.CharField(max_length=3, blank=True)

    # Exactly once: the client's key (+ a hash of what it sent), and the relay's claim
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    request_fingerprint = models.CharField(max_length=64, blank=True)
    relay_attempts = models.PositiveIntegerField(default=0)
    relay_token = models.UUIDField(null=True, blank=True)  # which relay run holds the claim
    relay_started_at = models.DateTimeField(null=True, blank=True)  # claim lease start, renewed while the relay works
    last_relay_error = models.TextField(blank=True)
    # What the job holds of its team's budget is accounting's row (accounting.models.BudgetHold, placed
    # in the transaction that stores the job, released or converted to usage by accounting).

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["submitter", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="job_unique_submitter_idempotency_key",
            ),
            models.UniqueConstraint(
                fields=["slurm_cluster", "slurm_job_id"],
                condition=Q(slurm_job_id__isnull=False),
                name="job_unique_cluster_slurm_job_id",
            ),
            models.CheckConstraint(condition=Q(state__in=JobState.values), name="job_state_valid"),
            models.CheckConstraint(condition=Q(gpus__gte=1) & Q(nodes__gte=1) & Q(cpus_per_gpu__gte=1), name="job_resources_positive"),
            models.CheckConstraint(condition=Q(array_tasks__gte=1) & Q(ntasks__gte=1), name="job_tasks_positive"),
            models.CheckConstraint(condition=Q(time_limit_minutes__gte=1), name="job_time_limit_positive"),
        ]
        indexes = [
            # jobs_sync and the sweeper: "every live job" (partial: terminal rows are the vast majority)
            models.Index(fields=["state", "created_at"], name="job_live_state", condition=Q(state__in=sorted(LIVE_STATES))),
            # jobs_sync per cluster: "every live job of this cluster"
            models.Index(fields=["cluster", "state"], name="job_live_cluster", condition=Q(state__in=sorted(LIVE_STATES))),
            # The job list's keyset pages (portal.paging: ORDER BY column DESC, id DESC; the next page
            # "column <= last AND (column < last OR id < last id)"): each index is the order of a list,
            # the primary key last, so any page is an index range read from its first row
            # (bench/bench_year_pages.py: a year of jobs, deep page = first page).
            # jobs of a team, newest first (jobs_visible_to + the default order)
            models.Index(fields=["team", "-created_at", "-id"], name="job_team_created_id"),
            # across teams (admins; members of several teams): the newest first
            models.Index(fields=["-created_at", "-id"], name="job_created_id"),
            # "my jobs" filter and the CLI's default list
            models.Index(fields=["submitter", "-created_at", "-id"], name="job_submitter_created_id"),
            # the list ordered by end or start (?ordering=-ended_at: "what just ended"); NULLs (not yet)
            # sort first descending, as the keyset expects
            models.Index(fields=["-ended_at", "-id"], name="job_ended_id"),
            models.Index(fields=["-started_at", "-id"], name="job_started_id"),
            # look-ups by Slurm id (CLI `gpuportal job 1234`, admin search, accounting joins)
            models.Index(fields=["slurm_job_id"], name="job_slurm_job_id"),
            # retention (jobs.services.retention): the jobs that ended in a range, oldest first. BRIN:
            # jobs end in about the order they are created, and it costs kilobytes, not a B-tree's ~90 MB a year
            BrinIndex(fields=["ended_at"], name="job_ended_brin"),
            # job_end_notify_sweep: ended jobs whose end notice is owed, by end (partial: a handful)
            models.Index(
                fields=["ended_at"], name="job_end_notice_owed",
                condition=Q(end_notified_at__isnull=True, slurm_job_id__isnull=False, state__in=sorted(TERMINAL_STATES)),
            ),  # fmt: skip
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.slurm_job_id or str(self.id)[:8]})"

    @property
    def slurm_tag(self) -> str:
        """The comment carried by this job in Slurm."""
        return tags.slurm_tag(self.id)

    @property
    def directives(self) -> list[dict]:
        """The options Slurm gets, each with the script's line it comes from (0: the portal's)."""
        request = self.request or {}
        return [{"option": option, "value": value, "line": line}
                for (option, value), line in zip(request.get("options", ()), request.get("lines", ()), strict=True)]  # fmt: skip

    @property
    def depends_on_ids(self) -> list[str]:
        """The portal jobs it waits for, as its request keeps them (no query; JobDependency has the rows)."""
        return list((self.request or {}).get("depends_on", ()))

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def cancel_requested(self) -> bool:
        return self.cancel_requested_at is not None

    @property
    def reason_explained(self):
        """Slurm's reason in words and what the submitter can change (jobs.pending's table); None
        when there is no reason or its code is not in the table."""
        from jobs.pending import reason_explained

        return reason_explained(self.state_reason) if self.state_reason else None

    @property
    def expected_start_passed(self) -> bool:
        """Slurm's planned start is already past (it starts at its next scheduling pass, or the plan
        is about to move): the page says "any moment" rather than a time gone by."""
        from django.utils import timezone

        return self.expected_start_at is not None and self.expected_start_at <= timezone.now()

    @property
    def is_waiting(self) -> bool:
        """Pending in Slurm (or requeued): its expected start and place in line apply."""
        return self.state in (JobState.PENDING, JobState.REQUEUED)


class JobDependency(models.Model):
    """``job`` waits for ``parent`` to complete successfully (afterok). Written with the job, never
    changed (jobs.dependencies)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+")
    parent = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "parent"], name="jobdependency_unique"),
            models.CheckConstraint(condition=~Q(job=F("parent")), name="jobdependency_not_self"),
        ]
        # the relay's claim (jobs.dependencies.relay_ready_sql: "a parent of this job still waits for
        # its Slurm id") reads by job: the unique constraint's index; by parent: the FK's own index

    def __str__(self) -> str:
        return f"{self.job_id} after {self.parent_id}"


class JobEvent(models.Model):
    """One state a job entered, with Slurm's reason (history shown on the job's page)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events", db_index=False)  # jobevent_job_at serves it
    state = models.CharField(max_length=16, choices=JobState.choices)
    reason = models.CharField(max_length=1024, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["at", "pk"]
        # a job's history (detail page / API)
        indexes = [models.Index(fields=["job", "at"], name="jobevent_job_at")]

    def __str__(self) -> str:
        return f"{self.job_id} {self.state} at {self.at:%Y-%m-%d %H:%M:%S}"


class JobTemplate(models.Model):
    """A reusable job spec. Scope personal (owner sees it), team (team members) or site (everyone
    logged in; created by admins only)."""

    scope = models.CharField(max_length=16, choices=TemplateScope.choices)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True, related_name="job_templates"
    )
    team = models.ForeignKey("portal.Team", on_delete=models.CASCADE, null=True, blank=True, related_name="job_templates")
    created_by = portal_models.user_reference()
    name = models.CharField(max_length=128)
    description = models.TextField(blank=True)
    script = models.TextField()
    partition = models.CharField(max_length=64, blank=True, help_text="Empty: the default partition.")
    gpu_type = models.CharField(max_length=32, blank=True)
    gpus = models.PositiveIntegerField(default=1)
    nodes = models.PositiveIntegerField(default=1)
    cpus_per_gpu = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: the script decides.")
    memory_gb = models.PositiveIntegerField(null=True, blank=True)
    time_limit_minutes = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: partition default.")
    workdir = models.CharField(max_length=1024, blank=True)
    environment = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["scope", "name"]
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(scope=TemplateScope.PERSONAL, owner__isnull=False, team__isnull=True)
                    | Q(scope=TemplateScope.TEAM, owner__isnull=True, team__isnull=False)
                    | Q(scope=TemplateScope.SITE, owner__isnull=True, team__isnull=True)
                ),
                name="jobtemplate_scope_target",
            ),
            models.UniqueConstraint(
                fields=["owner", "name"], condition=Q(scope=TemplateScope.PERSONAL), name="jobtemplate_unique_personal"
            ),
            models.UniqueConstraint(
                fields=["team", "name"], condition=Q(scope=TemplateScope.TEAM), name="jobtemplate_unique_team"
            ),
            models.UniqueConstraint(fields=["name"], condition=Q(scope=TemplateScope.SITE), name="jobtemplate_unique_site"),
        ]
        # job_templates_visible_to (owner = me OR team in my teams OR scope = site) uses the
        # foreign-key indexes Django creates on owner and team; no extra index needed.

    def __str__(self) -> str:
        return f"{self.name} ({self.scope})"


class JobArrayTask(models.Model):
    """One task of an array job (sbatch --array) as the sync last saw it in the queue or accounting.
    Tasks not seen yet are pending; the parent Job carries the array's overall state."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="array_task_rows")
    index = models.PositiveIntegerField()
    slurm_job_id = models.PositiveBigIntegerField(null=True, blank=True)  # the task's own id (squeue %A)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
    exit_code = models.IntegerField(null=True, blank=True)
    exit_signal = models.IntegerField(null=True, blank=True)  # as the job's
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # a cancel of this task alone asked for (POST …/cancel/?task=N), passed on by the job_array_task_cancel_relay task
    cancel_requested_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "index"]
        # one row per task; the job's page and API read a job's tasks in index order
        constraints = [models.UniqueConstraint(fields=["job", "index"], name="jobarraytask_unique_index")]
        # the GPU-usage sync: a task by its own Slurm id (the exporter's job label)
        indexes = [
            models.Index(fields=["slurm_job_id"], name="jobarraytask_slurm_job_id"),
            # jobs_sweep: the task cancels asked for and not yet done (partial: a handful, whatever the
            # year's millions of tasks; a task leaves it when it is recorded ended)
            models.Index(
                fields=["cancel_requested_at"], name="jobarraytask_cancel_owed",
                condition=Q(cancel_requested_at__isnull=False) & ~Q(state__in=sorted(TERMINAL_STATES)),
            ),  # fmt: skip
        ]

    def __str__(self) -> str:
        return f"{self.job_id}[{self.index}] {self.state}"


# ---------------------------------------------------------------- what the GPUs did (issue 32)


class JobGpuUsage(models.Model):
    """One GPU one job (one array task) held, as the site's Prometheus saw it (jobs.services.gpu_usage):
    running figures the GPU-usage sync adds to each cycle, frozen (``final``) once the job has ended and
    its last points are in, so the summary outlives Prometheus's retention. Means are sums over
    samples (one a GPU_USAGE_STEP_SECONDS step, each the mean over its step)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="gpu_usage")
    task_index = models.PositiveIntegerField(null=True, blank=True)  # array task; null: not an array
    slurm_job_id = models.PositiveBigIntegerField()  # the exporter's job label (an array task's own id)
    host = models.CharField(max_length=128)
    gpu = models.CharField(max_length=32)  # the GPU's index on its host, as the exporter labels it
    model_name = models.CharField(max_length=128, blank=True)
    step_seconds = models.PositiveIntegerField()
    samples = models.PositiveIntegerField(default=0)
    util_sum = models.FloatField(default=0)  # % x samples
    util_peak = models.FloatField(default=0)
    idle_samples = models.PositiveIntegerField(default=0)  # under GPU_IDLE_THRESHOLD_PERCENT
    mem_sum = models.FloatField(default=0)  # MiB x samples with a memory figure
    mem_samples = models.PositiveIntegerField(default=0)
    mem_peak = models.FloatField(default=0)
    first_at = models.DateTimeField()
    last_at = models.DateTimeField()
    idle_since = models.DateTimeField(null=True, blank=True)  # start of the idle run the last sample is in
    final = models.BooleanField(default=False)

    class Meta:
        ordering = ["job", "task_index", "host", "gpu"]
        constraints = [
            models.UniqueConstraint(fields=["job", "slurm_job_id", "host", "gpu"], name="jobgpuusage_unique_gpu"),
        ]
        indexes = [
            # the sync's finalisation and the idle alerts: the rows still growing (partial: few)
            models.Index(fields=["job"], name="jobgpuusage_open", condition=Q(final=False)),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} {self.host}/{self.gpu}"

    @property
    def util_mean(self) -> float:
        return self.util_sum / self.samples if self.samples else 0.0

    @property
    def mem_mean(self) -> float:
        return self.mem_sum / self.mem_samples if self.mem_samples else 0.0

    @property
    def idle_fraction(self) -> float:
        return self.idle_samples / self.samples if self.samples else 0.0


class JobGpuSample(models.Model):
    """Legacy (before issue 39): one raw point of a GPU's series per step. Nothing writes these any
    more (the raw points stay in Prometheus); ``manage.py gpu_samples_compact`` turns a site's existing
    rows into JobGpuSummary records and deletes them in batches, and the model goes with a later release."""

    usage = models.ForeignKey(JobGpuUsage, on_delete=models.CASCADE, related_name="points")
    at = models.DateTimeField()
    util = models.FloatField()
    mem_mib = models.FloatField(null=True)

    class Meta:
        ordering = ["usage", "at"]
        # a job's chart: the points of its GPUs in time order; one point per GPU and step
        constraints = [models.UniqueConstraint(fields=["usage", "at"], name="jobgpusample_unique_at")]


class JobGpuSummary(models.Model):
    """What a job's GPUs did, kept once it has ended (jobs.gpu_summary): per GPU its summary and one
    downsampled series (at most 240 points), compressed; written by the sync's finalisation (from
    Prometheus) or by the legacy rows' compaction. About 0.2 kB a job (bench/bench_gpu_storage.py).
    Expires under RETENTION_GPU_SUMMARY_DAYS (jobs.services.retention_apply)."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="gpu_summary")
    ended_at = models.DateTimeField()  # the job's end (retention's cut, without a join)
    data = models.BinaryField()

    class Meta:
        # retention: the records of jobs ended before a date. BRIN: rows arrive in end order, and a
        # B-tree would add ~30 bytes a job to a table meant to stay small
        indexes = [BrinIndex(fields=["ended_at"], name="jobgpusummary_ended")]

    def __str__(self) -> str:
        return f"GPU summary {self.job_id}"


class JobLogCopy(models.Model):
    """The log of a job's pod on a Kubernetes cluster (issue 41), kept by the jobs sync just before it
    deletes the finished Job (GPUPORTAL_K8S_FINISHED_JOB_TTL_SECONDS): with the Job go its pod and the
    pod's log, which is the job's output there. Its first GPUPORTAL_K8S_LOG_COPY_MAX_BYTES bytes
    (``truncated``: the log was longer), in the database so that every portal process serves it
    without a filesystem shared with the cluster; jobs.selectors.job_output reads it once the pod is
    gone. Expires under RETENTION_JOB_OUTPUT_DAYS (jobs.services.retention_apply). One per job, or for an
    array job one per task (each task is a Job and a pod of its own; ``task``: its index) — kept by the
    sync before it deletes the Jobs, or by the cancel before it deletes a running job's."""

    # no index of its own: joblogcopy_one_per_task (job, task) serves the look-ups by job
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_copies", db_index=False)
    task = models.PositiveIntegerField(null=True, blank=True)  # the array task's index; null: not an array
    ended_at = models.DateTimeField()  # the job's end (retention's cut, without a join)
    saved_at = models.DateTimeField()
    pod = models.CharField(max_length=253)  # the pod the log is of (a Kubernetes object name)
    data = models.BinaryField()  # bytes as the API server served them (TOAST compresses them)
    truncated = models.BooleanField(default=False)

    class Meta:
        # retention: the copies of jobs ended before a date (BRIN: rows arrive in end order)
        indexes = [BrinIndex(fields=["ended_at"], name="joblogcopy_ended")]
        # one copy per job and task (null the same as null: one for a job that is not an array); also the
        # reader's look-up (jobs.selectors.job_output: a job's copy, or its task's)
        constraints = [
            models.UniqueConstraint(fields=["job", "task"], nulls_distinct=False, name="joblogcopy_one_per_task"),
        ]

    def __str__(self) -> str:
        return f"Log of {self.job_id}" + (f" task {self.task}" if self.task is not None else "")


class JobGpuIdleAlert(models.Model):
    """A running job whose GPUs all stayed idle GPU_IDLE_ALERT_MINUTES: recorded once per job (the
    primary key decides between concurrent checks), mailed to its submitter and POSTed to the team's
    webhook, each claimed before it is sent (jobs.services.gpu_alerts)."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="gpu_idle_alert")
    created_at = models.DateTimeField()
    idle_since = models.DateTimeField()
    gpus = models.PositiveIntegerField()
    cost_so_far = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    currency = models.CharField(max_length=3, blank=True)
    emailed_at = models.DateTimeField(null=True, blank=True)
    webhook_delivered_at = models.DateTimeField(null=True, blank=True)
    webhook_error = models.TextField(blank=True)
    # the team's idle-GPU policy applied: the threshold it used and when the job is cancelled if its
    # GPUs stay idle (null: the site's informative alert, no cancel). A new idle run re-arms the warning.
    threshold_percent = models.FloatField(null=True, blank=True)
    cancel_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"idle GPUs: {self.job_id}"
