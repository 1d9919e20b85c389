"""GET /metrics: Prometheus text format, computed from the database at scrape time.

Nothing is counted in process memory: every web process answers the same figures, so Prometheus
may scrape any one of them (scrape ONE address — the figures are cluster-wide, not per process).
One scrape costs a constant six queries, whatever the number of jobs:

1. jobs GROUP BY team, state, and
2. the teams' slugs → ``gpuportal_jobs``, ``gpuportal_job_submissions_total``,
   ``gpuportal_job_relay_failures_total``
3. one conditional aggregation → ``gpuportal_job_relay_latency_seconds`` (histogram)
4. one conditional aggregation → ``gpuportal_job_queue_wait_seconds`` (histogram)
5. every SyncStatus row (one per kind) → ``gpuportal_sync_*``
6. nodes GROUP BY gpu_type, available → ``gpuportal_gpus``

plus whatever ``accounting.selectors.team_budget_ratios`` costs (``gpuportal_team_budget_used_ratio``).

Semantics worth knowing when writing queries:

- The two "counters" are counts of rows (jobs ever created; jobs in SUBMIT_FAILED). They only go
  down if job rows are deleted, which the portal never does (Job.team is PROTECT).
- The two histograms describe the jobs of the last ``METRICS_HISTOGRAM_WINDOW_HOURS`` (a sliding
  window, anchored on the event that ends the measured interval: ``submitted_at`` for the relay
  latency, ``started_at`` for the queue wait). Their buckets are a snapshot, not an ever-growing
  counter: use ``histogram_quantile(0.95, sum by (le) (…_bucket))`` directly, never ``rate()``.

Access (``METRICS_TOKEN``, ``METRICS_ALLOWED_IPS``): every configured check must pass. A token,
when set, is required as ``Authorization: Bearer <token>``. The IP allow-list, when not empty,
requires REMOTE_ADDR inside one of its addresses/networks — and never admits a request that came
through a reverse proxy (it carries ``X-Forwarded-For``): behind nginx on the same host every
request's REMOTE_ADDR is 127.0.0.1, so the allow-list would admit the whole Internet. With neither
configured the endpoint refuses everything (fail closed)."""

from __future__ import annotations

import datetime as dt
import hmac
from collections import defaultdict
from collections.abc import Iterable, Iterator

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, Sum, Value
from django.db.models.functions import Greatest
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from jobs.choices import JobState
from jobs.models import Job
from portal.models import NodeInfo, SyncStatus, Team
from portal.proxies import address_in

# Upper bounds (seconds). Relay: a healthy relay takes well under a second; minutes mean the
# broker, the workers or Slurm are in trouble. Queue wait: seconds on an idle cluster, days on a full one.
RELAY_LATENCY_BUCKETS: tuple[float, ...] = (0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
QUEUE_WAIT_BUCKETS: tuple[float, ...] = (
    10, 30, 60, 300, 600, 1800, 3600, 2 * 3600, 4 * 3600, 8 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400,
)  # fmt: skip

# The histograms of job intervals over the last METRICS_HISTOGRAM_WINDOW_HOURS: (name, what it
# measures, over which jobs; the interval's start and end fields; buckets).
JOB_INTERVAL_HISTOGRAMS: tuple[tuple[str, str, str, str, tuple[float, ...]], ...] = (
    ("gpuportal_job_relay_latency_seconds", "Accepted to Slurm job id (submitted_at - created_at), jobs submitted",
     "created_at", "submitted_at", RELAY_LATENCY_BUCKETS),
    ("gpuportal_job_queue_wait_seconds", "Pending in Slurm to running (started_at - submitted_at), jobs started",
     "submitted_at", "started_at", QUEUE_WAIT_BUCKETS),
)  # fmt: skip

UNTYPED_GPU = "untyped"  # gpu_type label of nodes whose GRES names no type ("gpu:4")


# ---------------------------------------------------------------- the collector


class PortalCollector:
    """A prometheus_client collector; registered on a fresh private registry for each scrape."""

    def __init__(self, *, now: dt.datetime | None = None):
        self.now = now

    def collect(self) -> Iterator[Metric]:
        now = self.now or timezone.now()
        hours = settings.METRICS_HISTOGRAM_WINDOW_HOURS
        yield from job_metrics()
        for name, what, start, end, buckets in JOB_INTERVAL_HISTOGRAMS:
            yield duration_histogram(name, f"{what} in the last {hours} h (a sliding window, not a counter).", start=start,
                                     end=end, since=now - dt.timedelta(hours=hours), buckets=buckets)  # fmt: skip
        yield from sync_metrics()
        yield gpu_metrics()
        yield from budget_metrics()


def job_metrics() -> Iterator[Metric]:
    """Jobs by team and state; submissions and relay failures per team. Two queries (jobs
    GROUP BY team, state; teams). Every team reports, with zeros when it has no jobs: a counter that
    appears only with its first increment loses that increment to rate()."""
    jobs = GaugeMetricFamily("gpuportal_jobs", "Jobs by state and team (every job ever stored).", labels=["state", "team"])
    submissions = CounterMetricFamily(
        "gpuportal_job_submissions", "Jobs accepted by the portal (rows ever created), by team.", labels=["team"]
    )
    failures = CounterMetricFamily(
        "gpuportal_job_relay_failures", "Jobs that could not be submitted to Slurm (SUBMIT_FAILED), by team.", labels=["team"]
    )
    # GROUP BY on jobs alone, then name the teams: aggregating before any join is 2–3× faster on
    # 200 000 jobs than grouping teams LEFT JOIN jobs. Jobs first: a team that has jobs cannot be
    # deleted (PROTECT), so every team_id read is still there when the teams are read.
    rows = list(Job.objects.order_by().values("team_id", "state").annotate(n=Count("pk")))
    slugs = dict(Team.objects.values_list("id", "slug"))
    counts: dict[str, dict[str, int]] = {slug: {} for slug in slugs.values()}
    for row in rows:
        counts[slugs[row["team_id"]]][row["state"]] = row["n"]
    for team in sorted(counts):
        by_state = counts[team]
        for state in JobState.values:
            jobs.add_metric([state, team], by_state.get(state, 0))
        submissions.add_metric([team], sum(by_state.values()))
        failures.add_metric([team], by_state.get(JobState.SUBMIT_FAILED, 0))
    yield from (jobs, submissions, failures)


def duration_histogram(
    name: str, documentation: str, *, start: str, end: str, since: dt.datetime, buckets: Iterable[float]
) -> HistogramMetricFamily:
    """A histogram of ``end − start`` over jobs whose ``end`` is at or after ``since``, counted in
    one query (one conditional COUNT per bucket). Negative intervals (Slurm's start time a moment
    before the portal recorded the submission) count as 0."""
    bounds = sorted(buckets)
    duration = Greatest(
        ExpressionWrapper(F(end) - F(start), output_field=DurationField()),
        Value(dt.timedelta(0), output_field=DurationField()),
        output_field=DurationField(),
    )
    aggregates = {f"le_{i}": Count("pk", filter=Q(duration__lte=dt.timedelta(seconds=b))) for i, b in enumerate(bounds)}
    row = (
        Job.objects.filter(**{f"{end}__gte": since, f"{start}__isnull": False})
        .annotate(duration=duration)
        .aggregate(count=Count("pk"), total=Sum("duration"), **aggregates)
    )
    cumulative = [(floatToGoString(b), row[f"le_{i}"]) for i, b in enumerate(bounds)]
    cumulative.append(("+Inf", row["count"]))
    total = row["total"].total_seconds() if row["total"] is not None else 0.0
    return HistogramMetricFamily(name, documentation, buckets=cumulative, sum_value=total)


def sync_metrics() -> Iterator[Metric]:
    """From SyncStatus, one row per kind (cluster, jobs, usage). The cycle duration is what the sync
    stored in ``data``: ``duration_ms`` (jobs_sync) or ``last_seconds`` (usage_ingest); kinds that
    store neither (cluster_sync, today) have no duration series."""
    duration = GaugeMetricFamily("gpuportal_sync_duration_seconds", "Duration of the last sync cycle.", labels=["kind"])
    last_success = GaugeMetricFamily(
        "gpuportal_sync_last_success_timestamp_seconds", "Unix time of the last successful sync.", labels=["kind"]
    )
    failing = GaugeMetricFamily(
        "gpuportal_sync_failing", "1 while the sync's last attempt failed (until its next success), else 0.", labels=["kind"]
    )
    for status in SyncStatus.objects.order_by("kind"):
        seconds = _sync_duration_seconds(status.data)
        if seconds is not None:
            duration.add_metric([status.kind], seconds)
        if status.last_success_at is not None:
            last_success.add_metric([status.kind], status.last_success_at.timestamp())
        failing.add_metric([status.kind], 1 if status.failing_since is not None else 0)
    yield from (duration, last_success, failing)


def _sync_duration_seconds(data) -> float | None:
    if not isinstance(data, dict):
        return None
    for key, scale in (("duration_ms", 1000.0), ("duration_seconds", 1.0), ("last_seconds", 1.0)):
        value = data.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value / scale
    return None


def gpu_metrics() -> GaugeMetricFamily:
    """GPUs per type as the last inventory sync saw them. For each type
    ``free + allocated + unavailable == total``: free counts idle GPUs of available nodes only;
    unavailable counts idle GPUs of drained/down nodes (GPUs allocated there still count as allocated)."""
    family = GaugeMetricFamily(
        "gpuportal_gpus", "GPUs by type and state (total, allocated, free, unavailable).", labels=["gpu_type", "state"]
    )
    figures: dict[str, dict[str, int]] = defaultdict(lambda: {"total": 0, "allocated": 0, "free": 0, "unavailable": 0})
    rows = (
        NodeInfo.objects.filter(gpus_total__gt=0)
        .order_by()
        .values("gpu_type", "available")
        .annotate(total=Sum("gpus_total"), allocated=Sum("gpus_allocated"))
    )
    for row in rows:
        entry = figures[row["gpu_type"] or UNTYPED_GPU]
        idle = max(row["total"] - row["allocated"], 0)
        entry["total"] += row["total"]
        entry["allocated"] += row["allocated"]
        entry["free" if row["available"] else "unavailable"] += idle
    for gpu_type in sorted(figures):
        for state, value in figures[gpu_type].items():
            family.add_metric([gpu_type, state], value)
    return family


def budget_metrics() -> Iterator[Metric]:
    """``gpuportal_team_budget_used_ratio{team,gpu_type}`` from
    ``accounting.selectors.team_budget_ratios()``: no arguments, a constant number of queries, an
    iterable of ``(team_slug, gpu_type, used_ratio)`` for the current budget period, ``gpu_type`` ""
    for a budget over every type, ratio used/granted (may exceed 1)."""
    from accounting.selectors import team_budget_ratios

    family = GaugeMetricFamily(
        "gpuportal_team_budget_used_ratio",
        "Share of the team's GPU budget used in the current period (1 = all of it).",
        labels=["team", "gpu_type"],
    )
    for team, gpu_type, ratio in team_budget_ratios():
        family.add_metric([team, gpu_type or "any"], float(ratio))
    yield family


# ---------------------------------------------------------------- access


def refusal_reason(request: HttpRequest) -> str | None:
    """Why this request may not read the metrics, or None when it may (see the module docstring)."""
    token = settings.METRICS_TOKEN
    allowed = settings.METRICS_ALLOWED_IPS
    if not token and not allowed:
        return "Metrics are disabled: set METRICS_TOKEN or METRICS_ALLOWED_IPS."
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            return "A valid 'Authorization: Bearer <METRICS_TOKEN>' header is required."
    if allowed:
        if "X-Forwarded-For" in request.headers:
            return "Proxied requests are not admitted by address; use METRICS_TOKEN."
        if not address_in(request.META.get("REMOTE_ADDR", ""), allowed):
            return "This address may not read the metrics."
    return None


# ---------------------------------------------------------------- the view


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    reason = refusal_reason(request)
    if reason is not None:
        return HttpResponse(reason + "\n", status=403, content_type="text/plain; charset=utf-8")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PortalCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_PLAIN_0_0_4)
