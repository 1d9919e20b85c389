"""GET /metrics: Prometheus text computed from database rows, a constant number of queries, access
by token and/or address, and a Grafana dashboard that only asks for metrics the endpoint exports."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from jobs.choices import JobState
from jobs.models import Job
from portal.project import metrics
from portal.models import NodeInfo
from portal.services import sync_record_failure, sync_record_success

pytestmark = pytest.mark.django_db

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gpuportal-dashboard.json"
LOCAL = "127.0.0.1"
ROLES = ("anonymous", "outsider", "member", "manager", "admin", "finance")


# ---------------------------------------------------------------- helpers


def make_job(team, submitter, *, state=JobState.COMPLETED, created_at=None, submitted_after=None, started_after=None) -> Job:
    """A job row as the services would have left it; durations in seconds after the previous step."""
    created_at = created_at or timezone.now() - dt.timedelta(hours=1)
    submitted_at = created_at + dt.timedelta(seconds=submitted_after) if submitted_after is not None else None
    started_at = submitted_at + dt.timedelta(seconds=started_after) if started_after is not None else None
    job = Job.objects.create(
        team=team, submitter=submitter, name="train", script="#!/bin/bash\ntrue\n", partition="gpu", gpu_type="a100",
        gpus=1, time_limit_minutes=30, workdir="/tmp", estimated_gpu_hours=Decimal("0.50"), state=state,
        submitted_at=submitted_at, started_at=started_at,
    )  # fmt: skip
    Job.objects.filter(pk=job.pk).update(created_at=created_at)  # auto_now_add ignores the value given
    return job


def scrape(client: Client | None = None, **extra) -> dict[tuple, float]:
    """GET /metrics from the local address; {(sample name, sorted label items): value}."""
    response = (client or Client()).get("/metrics", REMOTE_ADDR=LOCAL, **extra)
    assert response.status_code == 200, response.content
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }


def sample(samples: dict, name: str, **labels) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def names(samples: dict) -> set[str]:
    return {name for name, _ in samples}


@pytest.fixture
def no_budgets(monkeypatch):
    """No team has a budget: the budget selector answers nothing (its queries are not this test's)."""
    import accounting.selectors

    monkeypatch.setattr(accounting.selectors, "team_budget_ratios", lambda: [])


@pytest.fixture
def budgets(monkeypatch):
    """The budget selector's answer for two teams; records how often it is called."""
    import accounting.selectors

    calls = []

    def team_budget_ratios():
        calls.append(1)
        return [("vision", "a100", Decimal("0.75")), ("nlp", "", 1.25)]

    monkeypatch.setattr(accounting.selectors, "team_budget_ratios", team_budget_ratios)
    return calls


# ---------------------------------------------------------------- format and values


def test_metrics_is_prometheus_text_with_every_family(world, no_budgets):
    response = Client().get("/metrics", REMOTE_ADDR=LOCAL)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "no-cache" in response["Cache-Control"] or "max-age=0" in response["Cache-Control"]
    families = {f.name: f.type for f in text_string_to_metric_families(response.content.decode())}
    assert families == {
        "gpuportal_jobs": "gauge",
        "gpuportal_job_submissions": "counter",
        "gpuportal_job_relay_failures": "counter",
        "gpuportal_job_relay_latency_seconds": "histogram",
        "gpuportal_job_queue_wait_seconds": "histogram",
        "gpuportal_sync_duration_seconds": "gauge",
        "gpuportal_sync_last_success_timestamp_seconds": "gauge",
        "gpuportal_sync_failing": "gauge",
        "gpuportal_gpus": "gauge",
        "gpuportal_team_budget_used_ratio": "gauge",  # no samples: no team has a budget here
    }


def test_jobs_by_state_and_team_and_the_counters_match_the_rows(world, no_budgets):
    layout = {
        (world.vision, world.alice): {JobState.RUNNING: 3, JobState.COMPLETED: 2, JobState.SUBMIT_FAILED: 1, JobState.ACCEPTED: 1},
        (world.nlp, world.carol): {JobState.PENDING: 2, JobState.SUBMIT_FAILED: 2},
    }  # fmt: skip
    for (team, user), by_state in layout.items():
        for state, n in by_state.items():
            for _ in range(n):
                make_job(team, user, state=state)

    samples = scrape()

    for (team, _), by_state in layout.items():
        for state in JobState.values:
            assert sample(samples, "gpuportal_jobs", state=state, team=team.slug) == by_state.get(state, 0), (team, state)
        assert sample(samples, "gpuportal_job_submissions_total", team=team.slug) == sum(by_state.values())
        assert sample(samples, "gpuportal_job_relay_failures_total", team=team.slug) == by_state.get(JobState.SUBMIT_FAILED, 0)


def test_a_team_without_jobs_reports_zero_counters(world, no_budgets):
    make_job(world.vision, world.alice)
    samples = scrape()
    assert sample(samples, "gpuportal_job_submissions_total", team="nlp") == 0
    assert sample(samples, "gpuportal_job_relay_failures_total", team="nlp") == 0
    assert sample(samples, "gpuportal_jobs", state="RUNNING", team="nlp") == 0


def _expected_buckets(values: list[float], bounds) -> dict[str, float]:
    out = {floatToGoString(b): sum(1 for v in values if v <= b) for b in bounds}
    out["+Inf"] = len(values)
    return out


def _buckets(samples: dict, name: str) -> dict[str, float]:
    return {dict(labels)["le"]: value for (n, labels), value in samples.items() if n == f"{name}_bucket"}


def test_relay_latency_histogram_counts_the_jobs_submitted_in_the_window(world, no_budgets):
    now = timezone.now()
    latencies = [0.1, 0.3, 1.0, 3.0, 45.0, 700.0, 5000.0]  # 1.0 sits on a bound: le is inclusive
    for seconds in latencies:
        make_job(world.vision, world.alice, created_at=now - dt.timedelta(hours=2), submitted_after=seconds)
    make_job(world.nlp, world.carol, created_at=now - dt.timedelta(hours=30), submitted_after=2)  # outside 24 h
    make_job(world.nlp, world.carol, state=JobState.ACCEPTED)  # not in Slurm yet
    make_job(world.nlp, world.carol, state=JobState.SUBMIT_FAILED)  # never will be

    samples = scrape()

    name = "gpuportal_job_relay_latency_seconds"
    assert _buckets(samples, name) == _expected_buckets(latencies, metrics.RELAY_LATENCY_BUCKETS)
    assert sample(samples, f"{name}_count") == len(latencies)
    assert sample(samples, f"{name}_sum") == pytest.approx(sum(latencies))


def test_queue_wait_histogram_counts_the_jobs_started_in_the_window(world, no_budgets, settings):
    now = timezone.now()
    waits = [5.0, 10.0, 100.0, 4000.0, 50000.0]
    for seconds in waits:
        make_job(world.vision, world.alice, created_at=now - dt.timedelta(hours=20), submitted_after=1, started_after=seconds)
    # Slurm's start time a moment before the portal recorded the submission: counts as 0 s
    make_job(world.nlp, world.carol, created_at=now - dt.timedelta(hours=1), submitted_after=1, started_after=-2)
    old = make_job(world.nlp, world.carol, created_at=now - dt.timedelta(hours=31), submitted_after=1, started_after=60)
    make_job(world.nlp, world.carol, state=JobState.PENDING, submitted_after=1)  # still waiting

    samples = scrape()

    name = "gpuportal_job_queue_wait_seconds"
    expected = [*waits, 0.0]
    assert _buckets(samples, name) == _expected_buckets(expected, metrics.QUEUE_WAIT_BUCKETS)
    assert sample(samples, f"{name}_count") == len(expected)
    assert sample(samples, f"{name}_sum") == pytest.approx(sum(expected))

    settings.METRICS_HISTOGRAM_WINDOW_HOURS = 48  # the 31-hour-old start is now inside the window
    widened = scrape()
    assert sample(widened, f"{name}_count") == len(expected) + 1
    assert old.started_at is not None
    assert sample(widened, f"{name}_sum") == pytest.approx(sum(expected) + 60)


def test_sync_metrics_come_from_sync_status(world, no_budgets):
    jobs_at = timezone.now() - dt.timedelta(seconds=7)
    sync_record_success("jobs", data={"duration_ms": 1500.0, "live": 3, "changed": 1}, at=jobs_at)
    cluster_at = timezone.now() - dt.timedelta(minutes=5)
    sync_record_success("cluster", at=cluster_at)
    sync_record_failure("cluster", error="Unable to contact slurm controller")
    sync_record_success("usage", data={"last_seconds": 2.5})
    sync_record_failure("never", error="first attempt failed")  # no success yet

    samples = scrape()

    assert sample(samples, "gpuportal_sync_duration_seconds", kind="jobs") == 1.5
    assert sample(samples, "gpuportal_sync_duration_seconds", kind="usage") == 2.5
    assert sample(samples, "gpuportal_sync_duration_seconds", kind="cluster") is None  # not recorded by cluster_sync
    assert sample(samples, "gpuportal_sync_last_success_timestamp_seconds", kind="jobs") == pytest.approx(jobs_at.timestamp())
    assert sample(samples, "gpuportal_sync_last_success_timestamp_seconds", kind="cluster") == pytest.approx(cluster_at.timestamp())
    assert sample(samples, "gpuportal_sync_last_success_timestamp_seconds", kind="never") is None
    assert {k: sample(samples, "gpuportal_sync_failing", kind=k) for k in ("jobs", "cluster", "usage", "never")} == {
        "jobs": 0, "cluster": 1, "usage": 0, "never": 1,
    }  # fmt: skip


def test_gpus_by_type_and_state_come_from_the_inventory(world, no_budgets):
    nodes = [  # name, gpu_type, total, allocated, available
        ("a100-01", "a100", 4, 1, True),
        ("a100-02", "a100", 4, 4, True),
        ("a100-03", "a100", 4, 2, False),  # drained while two GPUs still run a job
        ("h100-01", "h100", 8, 0, True),
        ("h100-02", "h100", 8, 0, False),
        ("gpu-01", "", 2, 1, True),  # GRES without a type
        ("cpu-01", "", 0, 0, True),  # no GPUs: no series
    ]
    now = timezone.now()
    for name, gpu_type, total, allocated, available in nodes:
        NodeInfo.objects.create(
            name=name, state="MIXED" if available else "DRAINING", available=available, gpu_type=gpu_type,
            gpus_total=total, gpus_allocated=allocated, seen_at=now,
        )  # fmt: skip

    samples = scrape()

    for gpu_type in ("a100", "h100", ""):
        rows = [n for n in nodes if n[1] == gpu_type and n[2] > 0]
        expected = {
            "total": sum(n[2] for n in rows),
            "allocated": sum(n[3] for n in rows),
            "free": sum(n[2] - n[3] for n in rows if n[4]),
            "unavailable": sum(n[2] - n[3] for n in rows if not n[4]),
        }
        label = gpu_type or metrics.UNTYPED_GPU
        got = {state: sample(samples, "gpuportal_gpus", gpu_type=label, state=state) for state in expected}
        assert got == expected, gpu_type
        assert got["free"] + got["allocated"] + got["unavailable"] == got["total"]
    assert {dict(labels)["gpu_type"] for name, labels in samples if name == "gpuportal_gpus"} == {"a100", "h100", "untyped"}


# ---------------------------------------------------------------- budgets


def test_budget_ratio_is_absent_while_no_team_has_a_budget(world, no_budgets):
    assert "gpuportal_team_budget_used_ratio" not in names(scrape())


def test_budget_ratio_comes_from_the_accounting_selector(world, budgets):
    samples = scrape()
    assert sample(samples, "gpuportal_team_budget_used_ratio", team="vision", gpu_type="a100") == 0.75
    assert sample(samples, "gpuportal_team_budget_used_ratio", team="nlp", gpu_type="any") == 1.25
    assert len(budgets) == 1


# ---------------------------------------------------------------- query count


def _seed(world, n: int) -> None:
    now = timezone.now()
    states = [JobState.RUNNING, JobState.COMPLETED, JobState.SUBMIT_FAILED, JobState.PENDING, JobState.ACCEPTED]
    for i in range(n):
        team, user = (world.vision, world.alice) if i % 2 else (world.nlp, world.carol)
        state = states[i % len(states)]
        submitted = None if state in (JobState.ACCEPTED, JobState.SUBMIT_FAILED) else i % 7
        started = i * 13 if state in (JobState.RUNNING, JobState.COMPLETED) else None
        make_job(team, user, state=state, created_at=now - dt.timedelta(minutes=i), submitted_after=submitted, started_after=started)
    for i in range(n // 5):
        NodeInfo.objects.create(name=f"node-{n}-{i}", gpu_type="a100" if i % 2 else "h100", gpus_total=4, gpus_allocated=i % 5, seen_at=now)
    for kind in ("cluster", "jobs", "usage"):
        sync_record_success(kind, data={"duration_ms": 10})


def test_one_scrape_costs_the_same_few_queries_for_5_or_50_jobs(world, no_budgets, django_assert_max_num_queries):
    counts = []
    for n in (5, 50):
        Job.objects.all().delete()
        _seed(world, n)
        with django_assert_max_num_queries(6) as captured:
            samples = scrape()
        counts.append(len(captured.captured_queries))
        assert sum(v for (name, _), v in samples.items() if name == "gpuportal_job_submissions_total") == n
    assert counts[0] == counts[1]


# ---------------------------------------------------------------- access


def _get(settings_overrides: dict, settings, **extra):
    for key, value in settings_overrides.items():
        setattr(settings, key, value)
    return Client().get("/metrics", **extra)


@pytest.mark.parametrize(
    ("address", "allowed", "status"),
    [
        ("127.0.0.1", ["127.0.0.1", "::1"], 200),
        ("::1", ["127.0.0.1", "::1"], 200),
        ("::ffff:127.0.0.1", ["127.0.0.1", "::1"], 200),  # dual-stack socket
        ("10.1.2.3", ["127.0.0.1", "::1"], 403),
        ("10.1.2.3", ["10.0.0.0/8"], 200),
        ("192.168.1.10", ["10.0.0.0/8"], 403),
        ("2001:db8::5", ["2001:db8::/32"], 200),
        ("not-an-address", ["127.0.0.1"], 403),
    ],
)
def test_the_ip_allow_list_admits_only_its_addresses(world, settings, no_budgets, address, allowed, status):
    response = _get({"METRICS_TOKEN": "", "METRICS_ALLOWED_IPS": allowed}, settings, REMOTE_ADDR=address)
    assert response.status_code == status
    if status == 403:
        assert response["Content-Type"].startswith("text/plain")
        assert b"gpuportal_" not in response.content


def test_a_proxied_request_is_not_admitted_by_address(world, settings, no_budgets):
    """Behind nginx on the same host every request comes from 127.0.0.1: the allow-list must not admit it."""
    response = _get({"METRICS_TOKEN": ""}, settings, REMOTE_ADDR=LOCAL, HTTP_X_FORWARDED_FOR="203.0.113.9")
    assert response.status_code == 403
    assert b"METRICS_TOKEN" in response.content


@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        (None, 403),
        ("Bearer wrong-token", 403),
        ("Bearer s3cret-metrics-token-0123456789", 200),
        ("bearer s3cret-metrics-token-0123456789", 200),
        ("Token s3cret-metrics-token-0123456789", 403),
        ("s3cret-metrics-token-0123456789", 403),
        ("Bearer ", 403),
    ],
)
def test_the_token_is_required_when_set(world, settings, no_budgets, authorization, status):
    extra = {"REMOTE_ADDR": "198.51.100.7", "HTTP_X_FORWARDED_FOR": "198.51.100.7"}  # any address, proxied
    if authorization is not None:
        extra["HTTP_AUTHORIZATION"] = authorization
    response = _get({"METRICS_TOKEN": "s3cret-metrics-token-0123456789", "METRICS_ALLOWED_IPS": []}, settings, **extra)
    assert response.status_code == status
    if status == 403:
        assert response["Content-Type"].startswith("text/plain")


def test_token_and_allow_list_together_both_must_pass(world, settings, no_budgets):
    overrides = {"METRICS_TOKEN": "tok-abcdefghijklmnop", "METRICS_ALLOWED_IPS": ["10.0.0.0/8"]}
    good = "Bearer tok-abcdefghijklmnop"
    assert _get(overrides, settings, REMOTE_ADDR="10.0.0.5", HTTP_AUTHORIZATION=good).status_code == 200
    assert _get(overrides, settings, REMOTE_ADDR="10.0.0.5").status_code == 403
    assert _get(overrides, settings, REMOTE_ADDR="192.0.2.1", HTTP_AUTHORIZATION=good).status_code == 403


def test_with_neither_token_nor_allow_list_the_endpoint_is_closed(world, settings, no_budgets):
    response = _get({"METRICS_TOKEN": "", "METRICS_ALLOWED_IPS": []}, settings, REMOTE_ADDR=LOCAL)
    assert response.status_code == 403
    assert b"disabled" in response.content


@pytest.mark.parametrize("role", ROLES)
def test_logging_in_grants_nothing_the_address_decides(world, client_for, settings, no_budgets, role):
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOWED_IPS = ["127.0.0.1"]
    client = client_for(role)
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.50").status_code == 403
    assert client.get("/metrics", REMOTE_ADDR=LOCAL).status_code == 200


def test_only_get_is_allowed(world, no_budgets):
    assert Client().post("/metrics", REMOTE_ADDR=LOCAL).status_code == 405


def test_a_bad_allow_list_entry_stops_start_up():
    env = {**os.environ, "METRICS_ALLOWED_IPS": "127.0.0.1,10.0.0.0/33", "DJANGO_SETTINGS_MODULE": "portal.project.settings"}
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], env=env, capture_output=True, text=True, timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert result.returncode != 0
    assert "METRICS_ALLOWED_IPS" in result.stderr and "10.0.0.0/33" in result.stderr


# ---------------------------------------------------------------- the Grafana dashboard


def _panels(dashboard: dict):
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # panels inside collapsed rows


def test_the_dashboard_asks_only_for_metrics_the_endpoint_exports(world, budgets):
    _seed(world, 5)
    exported = names(scrape())
    dashboard = json.loads(DASHBOARD.read_text())

    expressions = [t["expr"] for p in _panels(dashboard) for t in p.get("targets", [])]
    expressions += [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert expressions
    used = set()
    # the per-job GPU panels read the GPU exporter's series (dcgm-exporter's names, its hpc_job label)
    gpu_exporter = [e for e in expressions if re.search(r"\bDCGM_FI_DEV_[A-Z_]+\{hpc_job=\"\$hpc_job\"\}", e)]
    assert len(gpu_exporter) == 2, gpu_exporter
    for expr in expressions:
        if expr in gpu_exporter:
            continue
        found = set(re.findall(r"\bgpuportal_[a-z0-9_]+", expr))
        assert found, f"no gpuportal metric in {expr!r}"
        used |= found
    assert used <= exported, f"not exported: {sorted(used - exported)}"
    # every family the brief asks for is on the dashboard
    for family in ("gpuportal_jobs", "gpuportal_job_submissions_total", "gpuportal_job_relay_failures_total",
                   "gpuportal_job_relay_latency_seconds_bucket", "gpuportal_job_queue_wait_seconds_bucket",
                   "gpuportal_gpus", "gpuportal_sync_duration_seconds", "gpuportal_sync_last_success_timestamp_seconds",
                   "gpuportal_team_budget_used_ratio"):  # fmt: skip
        assert family in used, family
    quantiles = [e for e in expressions if "histogram_quantile" in e]
    assert {re.search(r"histogram_quantile\((0\.\d+)", e).group(1) for e in quantiles} == {"0.5", "0.95"}
    assert not any("rate(" in e for e in quantiles), "window histograms are snapshots, not counters"


def test_the_dashboard_is_importable_with_a_prometheus_datasource_input():
    dashboard = json.loads(DASHBOARD.read_text())
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    assert dashboard["schemaVersion"] >= 36 and dashboard["uid"] and dashboard["id"] is None
    panels = list(_panels(dashboard))
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert {"x", "y", "w", "h"} <= panel["gridPos"].keys()
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs)


def test_the_interval_histograms_help_names_what_they_measure_and_the_window(world, no_budgets, settings):
    settings.METRICS_HISTOGRAM_WINDOW_HOURS = 36
    response = Client().get("/metrics", REMOTE_ADDR=LOCAL)
    helps = {family.name: family.documentation for family in text_string_to_metric_families(response.content.decode())}
    assert helps["gpuportal_job_relay_latency_seconds"] == (
        "Accepted to Slurm job id (submitted_at - created_at), jobs submitted in the last 36 h "
        "(a sliding window, not a counter)."
    )
    assert helps["gpuportal_job_queue_wait_seconds"] == (
        "Pending in Slurm to running (started_at - submitted_at), jobs started in the last 36 h "
        "(a sliding window, not a counter)."
    )
