"""Every accounting page and endpoint × the permission matrix; bad parameters; CSV; invoices."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal
from html import unescape as html_unescape
from urllib.parse import parse_qs

import pytest

from accounting.models import Rate
from accounting.services import rate_create, usage_records_upsert
from portal.exceptions import ApplicationError
from tests.accounting.helpers import acct, at, pdf_text

pytestmark = pytest.mark.django_db

ROLES = ("anonymous", "outsider", "member", "manager", "admin", "finance")


@pytest.fixture
def usage(world, settings):
    settings.TIME_ZONE = "UTC"
    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("8"), effective_from=dt.date(2025, 1, 1))
    usage_records_upsert(records=[
        acct(account="vision", user="alice", start=at(2026, 1, 5, 10), hours=2, gpus=2),
        acct(account="vision", user="bob", start=at(2026, 1, 7, 10), hours=1, gpus=1),
        acct(account="nlp", user="carol", start=at(2026, 1, 8, 10), hours=3, gpus=1),
    ])  # fmt: skip


RANGE = "start=2026-01-01&end=2026-01-31"
HOUR = "start=2026-01-05T11:30&end=2026-01-05T12:30"  # ISO datetimes (the site's time zone): one hour

PAGE_MATRIX = {
    # url: expected status per role (anonymous → redirect to login)
    f"/accounting/reports/?{RANGE}": {"anonymous": 302, "outsider": 403, "member": 403, "manager": 403, "admin": 200, "finance": 200},
    f"/accounting/reports/?{RANGE}&group_by=user&format=csv": {"anonymous": 302, "outsider": 403, "member": 403, "manager": 403, "admin": 200, "finance": 200},
    f"/accounting/reports/?{HOUR}": {"anonymous": 302, "outsider": 403, "member": 403, "manager": 403, "admin": 200, "finance": 200},
    f"/accounting/reports/?{HOUR}&group_by=user&format=csv": {"anonymous": 302, "outsider": 403, "member": 403, "manager": 403, "admin": 200, "finance": 200},
    "/accounting/rates/": {"anonymous": 302, "outsider": 200, "member": 200, "manager": 200, "admin": 200, "finance": 200},
    f"/accounting/usage/?team=vision&{RANGE}": {"anonymous": 302, "outsider": 404, "member": 200, "manager": 200, "admin": 200, "finance": 200},
    "/accounting/invoices/vision/2026-01/": {"anonymous": 302, "outsider": 404, "member": 403, "manager": 200, "admin": 200, "finance": 200},
    "/accounting/invoices/vision/2026-01.pdf": {"anonymous": 302, "outsider": 404, "member": 403, "manager": 200, "admin": 200, "finance": 200},
}

API_MATRIX = {  # anonymous: 401 (the token scheme answers with WWW-Authenticate)
    f"/api/v1/reports/cost/?{RANGE}&group_by=team": {"anonymous": 401, "outsider": 403, "member": 403, "manager": 403, "admin": 200, "finance": 200},
    f"/api/v1/reports/cost/?{RANGE}&format=csv": {"anonymous": 401, "outsider": 403, "member": 403, "manager": 403, "admin": 200, "finance": 200},
    f"/api/v1/teams/vision/usage/?{RANGE}": {"anonymous": 401, "outsider": 404, "member": 200, "manager": 200, "admin": 200, "finance": 200},
}


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("url", list(PAGE_MATRIX))
def test_page_permissions(usage, client_for, role, url):
    response = client_for(role).get(url)
    assert response.status_code == PAGE_MATRIX[url][role], (url, role)
    if response.status_code == 302:
        assert "/login/" in response["Location"]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("url", list(API_MATRIX))
def test_api_permissions(usage, api_client_for, role, url):
    response = api_client_for(role).get(url)
    expected = API_MATRIX[url][role]
    assert response.status_code == expected, (url, role, response.content[:200])
    if response.status_code >= 400 and "csv" not in url:
        assert set(response.json()) == {"detail", "errors"}


@pytest.mark.parametrize("role", ROLES)
def test_rate_create_only_admins(usage, client_for, role):
    response = client_for(role).post(
        "/accounting/rates/", {"gpu_type": "h100", "price_per_gpu_hour": "16", "effective_from": "2026-01-01"}
    )
    if role == "admin":
        assert response.status_code == 302
        assert Rate.objects.filter(gpu_type="h100", price_per_gpu_hour=16).exists()
    else:
        assert response.status_code == (302 if role == "anonymous" else 403)  # anonymous: to the login page
        assert not Rate.objects.filter(gpu_type="h100").exists()


@pytest.mark.parametrize("role", ["outsider", "member", "manager", "finance"])
def test_rate_create_service_refuses_everyone_but_admins(world, role):
    """The service owns the rule (the view, the admin and any other caller go through it)."""
    with pytest.raises(ApplicationError) as info:
        rate_create(gpu_type="h100", price_per_gpu_hour=Decimal("16"), effective_from=dt.date(2026, 1, 1),
                    created_by=world.user_for(role))  # fmt: skip
    assert info.value.status_code == 403 and not Rate.objects.filter(gpu_type="h100").exists()
    assert rate_create(gpu_type="h100", price_per_gpu_hour=Decimal("16"), effective_from=dt.date(2026, 1, 1),
                       created_by=world.admin).created_by == world.admin  # fmt: skip


def test_rate_history_kept_and_same_day_conflict(usage, client_for):
    client = client_for("admin")
    client.post("/accounting/rates/", {"gpu_type": "a100", "price_per_gpu_hour": "9", "effective_from": "2026-01-20"})
    assert list(Rate.objects.filter(gpu_type="a100").order_by("effective_from").values_list("price_per_gpu_hour", flat=True)) == [8, 9]
    response = client.post("/accounting/rates/", {"gpu_type": "a100", "price_per_gpu_hour": "10", "effective_from": "2026-01-20"})
    assert response.status_code == 200 and b"is taken" in response.content
    assert Rate.objects.filter(gpu_type="a100").count() == 2


def test_rate_change_reprices_existing_usage(usage, client_for, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        client_for("admin").post("/accounting/rates/", {"gpu_type": "a100", "price_per_gpu_hour": "10", "effective_from": "2026-01-08"})
    rows = client_for("finance").get(f"/api/v1/reports/cost/?{RANGE}&group_by=team").json()["results"]
    costs = {r["key"]: Decimal(r["cost"]) for r in rows}
    assert costs == {"vision": Decimal((2 * 2 + 1) * 8), "nlp": Decimal(3 * 10)}


@pytest.mark.parametrize(
    "query,field",
    [("start=2026-13-01", "start"), ("end=yesterday", "end"), ("group_by=planet", "group_by"),
     ("start=2026-02-01&end=2026-01-01", "end")],
)  # fmt: skip
def test_cost_api_bad_params_400(usage, api_client_for, query, field):
    response = api_client_for("finance").get(f"/api/v1/reports/cost/?{query}")
    assert response.status_code == 400
    body = response.json()
    assert set(body) == {"detail", "errors"} and field in body["errors"] and field in body["detail"]


def test_team_usage_api_bad_date_400(usage, api_client_for):
    response = api_client_for("member").get("/api/v1/teams/vision/usage/?start=nope")
    assert response.status_code == 400 and "start" in response.json()["errors"]


def test_report_page_bad_params_400(usage, client_for):
    assert client_for("finance").get("/accounting/reports/?start=2026-02-30").status_code == 400
    assert client_for("finance").get("/accounting/reports/?group_by=planet").status_code == 400


def test_cost_api_results_and_csv(usage, api_client_for):
    client = api_client_for("finance")
    body = client.get(f"/api/v1/reports/cost/?{RANGE}&group_by=user").json()
    rows = {r["key"]: r for r in body["results"]}
    assert Decimal(rows["alice"]["gpu_hours"]) == 4 and Decimal(rows["alice"]["cost"]) == 32
    response = client.get(f"/api/v1/reports/cost/?{RANGE}&group_by=user&format=csv")
    assert response["Content-Type"].startswith("text/csv")
    lines = response.content.decode("utf-8-sig").strip().splitlines()
    assert lines[0].startswith("group_by,key,label,gpu_hours")
    assert {line.split(",")[1] for line in lines[1:]} == {"alice", "bob", "carol"}


def test_report_page_csv_matches_api(usage, client_for, api_client_for):
    page = client_for("finance").get(f"/accounting/reports/?{RANGE}&group_by=team&format=csv").content
    api = api_client_for("finance").get(f"/api/v1/reports/cost/?{RANGE}&group_by=team&format=csv").content
    assert page == api


def test_csv_exports_start_with_a_utf8_bom_so_excel_reads_them_as_utf8(usage, world, client_for, api_client_for):
    world.vision.name = "视觉组 Łódź"
    world.vision.save()
    page = client_for("finance").get(f"/accounting/reports/?{RANGE}&group_by=team&format=csv")
    api = api_client_for("finance").get(f"/api/v1/reports/cost/?{RANGE}&group_by=team&format=csv")
    for response in (page, api):
        assert response.content.startswith(b"\xef\xbb\xbfgroup_by,key,label,")
        assert ",视觉组 Łódź," in response.content.decode("utf-8-sig")


def _api_rows(api_client_for, query: str, group_by: str) -> list[tuple]:
    body = api_client_for("finance").get(f"/api/v1/reports/cost/?{query}&group_by={group_by}").json()
    return [(r["key"], Decimal(r["gpu_hours"]), Decimal(r["cost"])) for r in body["results"]]


def test_report_page_takes_one_hour_in_local_time_and_shows_what_the_api_answers(usage, settings, client_for, api_client_for):
    """An hour asked for on the page in the site's time zone (Asia/Shanghai, UTC+8) is the same hour
    as the API's in UTC: the tables, the chart data and each CSV link give the API's prorated figures."""
    settings.TIME_ZONE = "Asia/Shanghai"
    local = "start=2026-01-05T19:30&end=2026-01-05T20:30"  # 11:30–12:30 UTC: alice's last half hour
    utc = "start=2026-01-05T11:30:00Z&end=2026-01-05T12:30:00Z"
    api = {group_by: _api_rows(api_client_for, utc, group_by) for group_by in ("team", "user", "gpu_type", "month")}
    assert api["user"] and all(hours < 4 for key, hours, cost in api["user"] if key == "alice"), api  # prorated: not the whole job
    assert api["team"] == _api_rows(api_client_for, local, "team")  # the API reads local times the same way

    response = client_for("finance").get(f"/accounting/reports/?{local}")
    assert response.status_code == 200
    data = response.context["data"]
    page = {"team": data["by_team"], "user": data["by_user"], "gpu_type": data["by_type"], "month": data["by_month"]}
    for group_by, rows in page.items():
        assert [(r["key"], r["gpu_hours"].quantize(Decimal("0.01")), r["cost"]) for r in rows] == api[group_by], group_by
    assert data["totals"]["cost"] == sum(cost for key, hours, cost in api["team"])
    html = response.content.decode()
    for key, hours, cost in api["team"]:
        assert f'<td class="num">{hours}</td>' in html and f'<td class="num">{cost}</td>' in html
    assert 'value="2026-01-05T19:30"' in html and "2026-01-05T19:30 – 2026-01-05T20:30 (Asia/Shanghai" in html

    links = re.findall(r'href="\?([^"]*format=csv[^"]*)"', html)
    assert len(links) == 4
    for link in links:  # each CSV link carries the hour asked for and answers the API's CSV
        query = parse_qs(html_unescape(link))
        assert (query["start"], query["end"]) == (["2026-01-05T19:30"], ["2026-01-05T20:30"])
        csv_page = client_for("finance").get(f"/accounting/reports/?{html_unescape(link)}")
        csv_api = api_client_for("finance").get(f"/api/v1/reports/cost/?{utc}&group_by={query['group_by'][0]}&format=csv")
        assert csv_page.status_code == 200 and csv_page.content == csv_api.content


def test_report_page_takes_a_day_alone_as_the_whole_day(usage, client_for, api_client_for):
    day = client_for("finance").get("/accounting/reports/?start=2026-01-05&end=2026-01-05").context["data"]["by_team"]
    as_times = _api_rows(api_client_for, "start=2026-01-05T00:00&end=2026-01-06T00:00", "team")
    assert [(r["key"], r["gpu_hours"].quantize(Decimal("0.01")), r["cost"]) for r in day] == as_times
    assert as_times == [("vision", Decimal("4.00"), Decimal("32.00"))]  # alice's whole job that day


@pytest.mark.parametrize(
    "query,field,reason",
    [("start=2026-01-05T13:00&end=2026-01-05T12:00", "end", "The end must be after the start."),
     ("start=2026-01-05T12:00&end=2026-01-05T12:00", "end", "The end must be after the start."),
     ("start=2026-01-05T25:00&end=2026-01-06", "start", "Give a day (YYYY-MM-DD) or an ISO 8601 date and time"),
     ("start=2026-01-05&end=noon", "end", "Give a day (YYYY-MM-DD) or an ISO 8601 date and time")],
)  # fmt: skip
def test_report_page_names_the_field_of_a_bad_range(usage, client_for, api_client_for, query, field, reason):
    for suffix in ("", "&format=csv"):
        response = client_for("finance").get(f"/accounting/reports/?{query}{suffix}")
        assert response.status_code == 400 and "data" not in response.context
        assert any(reason in message for message in response.context["form"].errors[field]), response.context["form"].errors
        assert html_unescape(response.content.decode()).count(reason) == 1
    api = api_client_for("finance").get(f"/api/v1/reports/cost/?{query}")  # the same rule answers the API
    assert api.status_code == 400 and any(reason in message for message in api.json()["errors"][field])


def test_report_page_renders_charts(usage, client_for):
    response = client_for("admin").get(f"/accounting/reports/?{RANGE}")
    content = response.content.decode()
    assert "chart-4.6.1.umd.min.js" in content and 'id="report-chart-data"' in content and "Vision" in content


def test_usage_page_user_breakdown_for_managers_only(usage, client_for, api_client_for):
    assert b"Per user" not in client_for("member").get(f"/accounting/usage/?team=vision&{RANGE}").content
    assert b"Per user" in client_for("manager").get(f"/accounting/usage/?team=vision&{RANGE}").content
    assert api_client_for("member").get(f"/api/v1/teams/vision/usage/?{RANGE}").json()["users"] is None
    users = api_client_for("manager").get(f"/api/v1/teams/vision/usage/?{RANGE}").json()["users"]
    assert {u["key"] for u in users} == {"alice", "bob"}
    # a member of vision cannot read nlp's usage
    assert client_for("member").get(f"/accounting/usage/?team=nlp&{RANGE}").status_code == 404
    assert api_client_for("member").get(f"/api/v1/teams/nlp/usage/?{RANGE}").status_code == 404


def test_invoice_html_and_pdf(usage, client_for):
    client = client_for("finance")
    html = client.get("/accounting/invoices/vision/2026-01/").content.decode()
    assert "Vision" in html and "40.00" in html  # (2×2 + 1×1) GPU-h × 8
    assert "Bookings" in html
    pdf = client.get("/accounting/invoices/vision/2026-01.pdf")
    assert pdf["Content-Type"] == "application/pdf"
    assert pdf.content.startswith(b"%PDF-") and pdf.content.rstrip().endswith(b"%%EOF")
    text = pdf_text(pdf.content)
    assert "Total" in text and "40.00" in text and "Bookings" in text


def test_invoice_bad_month_404(usage, client_for):
    assert client_for("admin").get("/accounting/invoices/vision/2026-13/").status_code == 404
    assert client_for("admin").get("/accounting/invoices/nobody/2026-01/").status_code == 404
