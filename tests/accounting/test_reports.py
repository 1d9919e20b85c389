"""cost_report grouping (expectations computed from the inputs), range proration, CSV, cloud figures."""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections import defaultdict
from decimal import Decimal

import pytest
from django.core.exceptions import ImproperlyConfigured

from accounting.models import Rate
from accounting.reports import cloud_comparison, parse_gpu_prices, report_page_data, rows_to_csv
from accounting.selectors import cost_report
from accounting.services import usage_records_upsert
from tests.accounting.helpers import acct, at
from tests.factories import NodeFactory

pytestmark = pytest.mark.django_db

PRICES = {"a100": Decimal("8"), "h100": Decimal("16")}
JOBS = [  # (account, user, gpu_type, gpus, start, hours, time limit minutes)
    ("vision", "alice", "a100", 2, at(2026, 1, 5, 10), 3, 240),
    ("vision", "bob", "h100", 1, at(2026, 1, 31, 22), 4, 600),  # crosses into February
    ("nlp", "carol", "a100", 4, at(2026, 2, 10, 0), 1.5, 120),
    ("nlp", "dave", "h100", 2, at(2026, 2, 20, 6), 2, 180),
    ("other", "mallory", "a100", 1, at(2026, 1, 12), 5, None),  # not a portal team, no time limit
]


@pytest.fixture
def usage(world, settings):
    settings.TIME_ZONE = "UTC"
    for gpu_type, price in PRICES.items():
        Rate.objects.create(gpu_type=gpu_type, price_per_gpu_hour=price, effective_from=dt.date(2025, 1, 1))
    records = [
        acct(account=a, user=u, gpu_type=t, gpus=g, start=s, hours=h, time_limit_minutes=limit)
        for a, u, t, g, s, h, limit in JOBS
    ]
    usage_records_upsert(records=records)
    return records


def _expected(key_of, start: dt.datetime, end: dt.datetime):
    """Used/requested GPU-hours and cost per group, computed from JOBS clipped to [start, end)."""
    out = defaultdict(lambda: {"used": Decimal(0), "requested": Decimal(0), "cost": Decimal(0)})
    for account, user, gpu_type, gpus, job_start, hours, limit in JOBS:
        job_end = job_start + dt.timedelta(hours=hours)
        # the requested GPU time lies where the requested window [start, start + limit) does, and
        # what the job left unused at its last month; walk month by month so that "month" groups can
        # be computed too (a range that cuts a month takes its share of that month's piece)
        requested_left = Decimal(gpus * (limit * 60 if limit else hours * 3600)) / 3600
        window_end = job_start + (dt.timedelta(minutes=limit) if limit else dt.timedelta(hours=hours))
        cursor = job_start
        while cursor < job_end:
            month_end = dt.datetime(cursor.year + (cursor.month == 12), cursor.month % 12 + 1, 1, tzinfo=dt.UTC)
            piece_end = min(job_end, month_end)
            if piece_end == job_end:
                requested_piece = requested_left
            else:
                in_window = max(dt.timedelta(0), min(piece_end, window_end) - cursor)
                requested_piece = min(requested_left, Decimal(gpus) * Decimal(in_window.total_seconds()) / 3600)
                requested_left -= requested_piece
            a, b = max(cursor, start), min(piece_end, end)
            if b > a:
                share = Decimal((b - a).total_seconds()) / Decimal((piece_end - cursor).total_seconds())
                used = Decimal(gpus) * Decimal((b - a).total_seconds()) / 3600
                key = key_of(account=account, user=user, gpu_type=gpu_type, month=f"{cursor:%Y-%m}")
                out[key]["used"] += used
                out[key]["requested"] += requested_piece * share
                out[key]["cost"] += used * PRICES[gpu_type]
            cursor = piece_end
    return out


KEYS = {
    "team": lambda **k: k["account"],
    "user": lambda **k: k["user"],
    "gpu_type": lambda **k: k["gpu_type"],
    "month": lambda **k: k["month"],
}


@pytest.mark.parametrize("group_by", list(KEYS))
@pytest.mark.parametrize(
    "start,end",
    [(dt.date(2026, 1, 1), dt.date(2026, 2, 28)), (dt.date(2026, 2, 1), dt.date(2026, 2, 28)), (dt.date(2026, 1, 5), dt.date(2026, 2, 1))],
)
def test_cost_report_groups_match_inputs(usage, group_by, start, end):
    rows = cost_report(start=start, end=end, group_by=group_by)
    expected = _expected(KEYS[group_by], at(start.year, start.month, start.day), at(end.year, end.month, end.day) + dt.timedelta(days=1))
    q = Decimal("0.01")
    assert {r["key"]: (r["gpu_hours"], r["requested_gpu_hours"], r["cost"]) for r in rows} == {
        k: (v["used"].quantize(q), v["requested"].quantize(q), v["cost"].quantize(q)) for k, v in expected.items()
    }
    for row in rows:
        assert row["efficiency"] == pytest.approx(float(row["gpu_hours"] / row["requested_gpu_hours"]), abs=1e-3)
        assert row["currency"] == "CNY"


def test_team_rows_carry_team_names(usage, world):
    rows = {r["key"]: r for r in cost_report(start=dt.date(2026, 1, 1), end=dt.date(2026, 2, 28), group_by="team")}
    assert rows["vision"]["label"] == "Vision" and rows["vision"]["team_slug"] == "vision"
    assert rows["other"]["team_slug"] == "" and "no team" in rows["other"]["label"]


def test_cost_report_one_query(usage, django_assert_num_queries):
    # the slices' aggregate + the bookings charged in the range + which whole months are rolled up
    # (accounting.selectors.usage_totals: a per-process snapshot, read here since this test's transaction
    # wrote the months' state; none is rolled: both months from their slices)
    with django_assert_num_queries(3):
        cost_report(start=dt.date(2026, 1, 1), end=dt.date(2026, 2, 28), group_by="team")


def test_team_filter(usage, world):
    rows = cost_report(start=dt.date(2026, 1, 1), end=dt.date(2026, 2, 28), group_by="user", team=world.vision)
    assert {r["key"] for r in rows} == {"alice", "bob"}


def test_csv_has_the_same_rows(usage):
    rows = cost_report(start=dt.date(2026, 1, 1), end=dt.date(2026, 2, 28), group_by="gpu_type")
    text = rows_to_csv(rows)
    assert text.startswith("\ufeffgroup_by,")  # the BOM that makes Excel read UTF-8
    parsed = list(csv.DictReader(io.StringIO(text.removeprefix("\ufeff"))))
    assert [(p["key"], Decimal(p["gpu_hours"]), Decimal(p["cost"])) for p in parsed] == [
        (r["key"], r["gpu_hours"], r["cost"]) for r in rows
    ]


def test_cloud_comparison_and_break_even(usage, settings):
    NodeFactory(name="a1", gpu_type="a100", gpus_total=8)
    NodeFactory(name="h1", gpu_type="h100", gpus_total=4)
    settings.CLOUD_GPU_HOUR_PRICES = "a100=10,h100=30"
    settings.CLUSTER_PURCHASE_COST = 480000.0
    settings.CLUSTER_DEPRECIATION_MONTHS = 48
    settings.CLUSTER_MONTHLY_OPEX = 5000.0
    start, end = dt.date(2026, 1, 1), dt.date(2026, 2, 28)
    span = {"start_at": at(2026, 1, 1), "end_at": at(2026, 3, 1)}  # the same days as instants
    by_type = cost_report(start=start, end=end, group_by="gpu_type")
    cloud = cloud_comparison(**span, by_type=by_type)
    hours = {r["key"]: r["gpu_hours"] for r in by_type}
    assert cloud["cloud_cost"] == hours["a100"] * 10 + hours["h100"] * 30
    monthly = Decimal(480000) / 48 + 5000
    assert cloud["break_even_utilisation"] == pytest.approx(float(monthly / (Decimal(730) * (8 * 10 + 4 * 30))))
    data = report_page_data(**span)
    util = {r["gpu_type"]: r for r in data["utilisation"]}
    assert util["a100"]["available_gpu_hours"] == 8 * 59 * 24
    assert util["a100"]["utilisation"] == pytest.approx(float(hours["a100"] / (8 * 59 * 24)))


@pytest.mark.parametrize("value", ["a100", "a100=x", "=3", "a100=-1"])
def test_cloud_prices_are_strict(value):
    with pytest.raises(ImproperlyConfigured, match="CLOUD_GPU_HOUR_PRICES"):
        parse_gpu_prices("CLOUD_GPU_HOUR_PRICES", value)


def test_cloud_prices_parse():
    assert parse_gpu_prices("X", " a100=8, h100=20.5 ,") == {"a100": Decimal(8), "h100": Decimal("20.5")}
