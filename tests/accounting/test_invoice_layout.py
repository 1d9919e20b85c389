"""Invoices a finance office can file: the total and the team's summary first (page 1 of the PDF,
read back with pdftotext), rows with usage only, one page for a quiet month; the report links only
to months in which a team used something; the usage table's header names the currency. Quota
requests can be withdrawn (page and API); error pages come in the portal's layout."""

from __future__ import annotations

import datetime as dt
import subprocess
from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from accounting.models import QuotaState, Rate
from accounting.services import quota_request, usage_records_upsert
from tests.accounting.helpers import acct, at

pytestmark = pytest.mark.django_db


def _pdf_pages(pdf: bytes) -> list[str]:
    """The text of each page (pdftotext separates pages with form feeds)."""
    out = subprocess.run(["pdftotext", "-layout", "-", "-"], input=pdf, capture_output=True, check=True).stdout.decode()
    return out.rstrip("\f").split("\f")


@pytest.fixture
def two_teams_january(world, settings):
    """Vision: 80 jobs of 1 GPU-hour plus 5 that failed after 2 s, at 8 CNY (640.00 + 5 × 0.00444… =
    640.02); nlp: one job of 3 GPU-hours (24.00). All in January 2026."""
    settings.TIME_ZONE = "UTC"
    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("8"), effective_from=dt.date(2025, 1, 1))
    records = [acct(account="vision", user="alice", start=at(2026, 1, 1 + i % 28, i % 24), hours=1, job_id=8000 + i) for i in range(80)]
    records += [acct(account="vision", user="alice", start=at(2026, 1, 3, 9), hours=2 / 3600, job_id=8900 + i, state="FAILED")
                for i in range(5)]  # 2 s each: 0.00 GPU-hours on a row of their own
    records.append(acct(account="nlp", user="carol", start=at(2026, 1, 9, 9), hours=3, job_id=9100))
    usage_records_upsert(records=records)
    return world


def test_the_total_is_on_page_one_and_rows_without_usage_are_left_out(two_teams_january, client_for):
    client = client_for("finance")
    response = client.get("/accounting/invoices/vision/2026-01.pdf")
    assert response.status_code == 200
    pages = _pdf_pages(response.content)
    assert len(pages) >= 2  # 80 rows: the jobs run over several pages ...
    first = pages[0]
    assert "Total" in first and "640.02 CNY" in first  # ... and the total is on the first
    assert first.index("Total") < first.index("Jobs")
    everything = "\n".join(pages)
    assert "8900" not in everything and "5 jobs of under 0.01 GPU-hours" in everything  # no rows of 0.00
    assert "0.0028 GPU-hours and 0.02 CNY" in everything
    assert "9100" not in everything and "24.00" not in everything  # the other team's job is not on this invoice
    html = client.get("/accounting/invoices/vision/2026-01/").content.decode()
    assert html.index("640.02 CNY") < html.index("<h2>Jobs</h2>") and ">8900<" not in html


def test_a_quiet_month_is_one_page(two_teams_january, client_for):
    pages = _pdf_pages(client_for("finance").get("/accounting/invoices/nlp/2026-01.pdf").content)
    assert len(pages) == 1 and "24.00 CNY" in pages[0]
    empty = _pdf_pages(client_for("finance").get("/accounting/invoices/nlp/2026-02.pdf").content)
    assert len(empty) == 1 and "0.00 CNY" in empty[0]


def test_the_report_links_invoices_only_of_months_with_usage(two_teams_january, client_for):
    html = client_for("finance").get("/accounting/reports/", {"start": "2026-01-01", "end": "2026-12-31"}).content.decode()
    assert "/accounting/invoices/vision/2026-01/" in html and "/accounting/invoices/nlp/2026-01/" in html
    assert "/accounting/invoices/vision/2026-02/" not in html and "2026-12/" not in html


def test_the_usage_table_names_the_currency(two_teams_january, client_for):
    html = client_for("manager").get("/accounting/usage/", {"team": "vision", "start": "2026-01-01", "end": "2026-01-31"}).content.decode()
    assert "Cost ()" not in html and html.count("Cost (CNY)") == 2  # per month and per user


# ---------------------------------------------------------------- withdrawing a quota request


def test_a_manager_withdraws_a_pending_request_from_the_page(world, client_for):
    quota = quota_request(team=world.vision, user=world.bob, gpu_hours=10, justification="x")
    client = client_for("manager")
    html = client.get("/accounting/quotas/").content.decode()
    assert f'action="/accounting/quotas/{quota.pk}/withdraw/"' in html and "data-confirm=" in html
    assert world.vision.name in html
    assert client_for("member").get("/accounting/quotas/").content.decode().count("/withdraw/") == 0
    response = client.post(f"/accounting/quotas/{quota.pk}/withdraw/")
    assert response.status_code == 302
    quota.refresh_from_db()
    assert quota.state == QuotaState.CANCELLED and quota.decided_by == world.bob


def test_the_api_withdraws_only_a_request_awaiting_approval(world):
    from accounting.services import quota_approve

    api = APIClient()
    api.force_authenticate(world.bob)
    quota = quota_request(team=world.vision, user=world.bob, gpu_hours=10, justification="x")
    answer = api.post(f"/api/v1/quotas/{quota.pk}/withdraw/")
    assert answer.status_code == 200 and answer.json()["state"] == "cancelled"
    again = api.post(f"/api/v1/quotas/{quota.pk}/withdraw/")
    assert again.status_code == 409 and "state" in again.json()["errors"]
    approved = quota_approve(quota=quota_request(team=world.vision, user=world.bob, gpu_hours=5, justification="y"), user=world.admin)
    refused = api.post(f"/api/v1/quotas/{approved.pk}/withdraw/")
    assert refused.status_code == 409
    approved.refresh_from_db()
    assert approved.state == QuotaState.APPROVED  # an approved quota is revoked by an admin, not withdrawn


# ---------------------------------------------------------------- error pages


def test_error_pages_are_in_the_portals_layout_with_a_way_back(world, client_for):
    from tests.security.test_url_matrix import make_job

    job = make_job(world.nlp, world.carol)
    response = client_for("member").get(f"/jobs/{job.pk}/")
    assert response.status_code == 404
    html = response.content.decode()
    assert 'class="top"' in html and 'aria-label="Main"' in html and 'href="/"' in html and "Nothing here" in html
    forbidden = client_for("member").get("/accounting/reports/")
    assert forbidden.status_code == 403 and 'class="top"' in forbidden.content.decode() and "Not allowed" in forbidden.content.decode()
    api = client_for("member").get(f"/api/v1/jobs/{job.pk}/")
    assert api.status_code == 404 and set(api.json()) == {"detail", "errors"}  # the API stays JSON
