"""Usage of several clusters: each cluster's accounting is recorded under its name and its team
accounts (TeamClusterAccount), its high-water mark is its own, and the cost report groups and
filters by cluster (JSON and CSV). Budgets and quotas count a team's usage on every cluster."""

from __future__ import annotations

import csv
import datetime as dt
import io
from decimal import Decimal

import pytest

from accounting.models import Rate, UsageRecord
from accounting.selectors import cost_report
from accounting.services import usage_records_upsert, usage_window_start
from portal.models import SyncStatus, TeamClusterAccount
from portal.services import cluster_row, clusters_record
from portal.slurm import ClusterConfig
from tests.accounting.helpers import acct, at

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_clusters(settings, world):
    settings.TIME_ZONE = "UTC"
    settings.GPUPORTAL_CLUSTERS = (ClusterConfig(settings.SLURM_CLUSTER, "cli"), ClusterConfig("site25", "cli"))
    clusters_record()
    TeamClusterAccount.objects.create(team=world.vision, cluster=cluster_row("site25"), slurm_account="vision25")
    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("8"), effective_from=dt.date(2025, 1, 1))
    return settings.SLURM_CLUSTER


def test_each_cluster_is_recorded_under_its_name_and_its_team_accounts(two_clusters, world, settings):
    mark = at(2026, 1, 11)
    usage_records_upsert(records=[acct(account="vision", gpus=2, hours=1, job_id=7, cluster=two_clusters)],
                         high_water_mark=mark)  # fmt: skip
    usage_records_upsert(
        records=[acct(account="vision25", gpus=4, hours=1, job_id=7, cluster="site25"),
                 acct(account="vision", gpus=1, hours=1, job_id=8, cluster="site25")],  # "vision" means nothing there
        high_water_mark=mark + dt.timedelta(hours=1), cluster="site25",
    )  # fmt: skip
    rows = {(r.cluster, r.job_id): r for r in UsageRecord.objects.all()}
    assert set(rows) == {(two_clusters, 7), ("site25", 7), ("site25", 8)}  # job 7 on each: two records
    assert rows[(two_clusters, 7)].team_id == world.vision.pk
    assert rows[("site25", 7)].team_id == world.vision.pk
    assert rows[("site25", 8)].team_id is None
    assert SyncStatus.objects.get(kind="usage").data["high_water_mark"] == mark.isoformat()
    assert SyncStatus.objects.get(kind="usage:site25").data["high_water_mark"] == (mark + dt.timedelta(hours=1)).isoformat()
    overlap = dt.timedelta(seconds=settings.ACCOUNTING_INGEST_OVERLAP_SECONDS)
    assert usage_window_start(now=at(2026, 1, 12), cluster="site25") == mark + dt.timedelta(hours=1) - overlap
    assert usage_window_start(now=at(2026, 1, 12)) == mark - overlap


def test_the_cost_report_groups_and_filters_by_cluster(two_clusters, world, client):
    usage_records_upsert(records=[acct(account="vision", gpus=2, hours=1, cluster=two_clusters)])
    usage_records_upsert(records=[acct(account="vision25", gpus=4, hours=1, cluster="site25")], cluster="site25")
    start, end = dt.date(2026, 1, 1), dt.date(2026, 1, 31)
    by_cluster = {r["key"]: r for r in cost_report(start=start, end=end, group_by="cluster")}
    assert {k: (r["gpu_hours"], r["cost"]) for k, r in by_cluster.items()} == {
        two_clusters: (Decimal("2.00"), Decimal("16.00")), "site25": (Decimal("4.00"), Decimal("32.00"))}
    by_team = cost_report(start=start, end=end, group_by="team", cluster="site25")
    assert [(r["key"], r["gpu_hours"]) for r in by_team] == [("vision25", Decimal("4.00"))]
    client.force_login(world.finn)
    answer = client.get("/api/v1/reports/cost/", {"start": start, "end": end, "group_by": "cluster", "format": "csv"})
    assert answer.status_code == 200
    lines = list(csv.DictReader(io.StringIO(answer.content.decode("utf-8-sig"))))
    assert {line["key"]: line["gpu_hours"] for line in lines} == {two_clusters: "2.00", "site25": "4.00"}
    answer = client.get("/api/v1/reports/cost/", {"start": start, "end": end, "group_by": "team", "cluster": "site25"})
    assert [(r["key"], r["gpu_hours"]) for r in answer.json()["results"]] == [("vision25", "4.00")]


def test_a_quota_counts_the_teams_usage_on_every_cluster(two_clusters, world):
    from accounting.selectors import team_budget
    from tests.factories import QuotaFactory

    QuotaFactory(team=world.vision, gpu_hours=100, period_start=dt.date(2026, 1, 1), period_end=dt.date(2026, 2, 1))
    usage_records_upsert(records=[acct(account="vision", gpus=2, hours=1, cluster=two_clusters)])
    usage_records_upsert(records=[acct(account="vision25", gpus=4, hours=1, cluster="site25")], cluster="site25")
    rows = [r for r in team_budget(team=world.vision, at=at(2026, 1, 20)) if r["quota"].period_start == dt.date(2026, 1, 1)]
    assert rows and rows[0]["used"] == Decimal("6.00")


def test_the_report_page_has_a_table_by_cluster_when_several_are_served(two_clusters, world, client):
    usage_records_upsert(records=[acct(account="vision", gpus=2, hours=1, cluster=two_clusters)])
    usage_records_upsert(records=[acct(account="vision25", gpus=4, hours=1, cluster="site25")], cluster="site25")
    client.force_login(world.finn)
    page = client.get("/accounting/reports/", {"start": "2026-01-01", "end": "2026-01-31"}).content.decode()
    assert "<h2>By cluster</h2>" in page and "site25" in page
