"""The PDF invoice is the HTML invoice (one template, rendered by WeasyPrint): read back with
pdftotext it has the same rows, the same local times and the full names, Chinese and Polish ones
included. (The hand-written PDF printed 视觉组 as ??? and Łódź as ?ód?, cut names at 30 characters
and gave times in UTC while the page used the viewer's zone.)"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from decimal import Decimal

import pytest

from accounting.models import Rate
from accounting.services import usage_records_upsert
from tests.accounting.helpers import acct, at, pdf_text

pytestmark = pytest.mark.django_db

LONG_NAME = "Łódź-resnet50-finetune-imagenet-22k-long-run"  # 44 characters


@pytest.fixture
def chinese_team(world, settings):
    settings.TIME_ZONE = "Europe/Warsaw"
    world.vision.name = "视觉组"
    world.vision.save()
    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("8"), effective_from=dt.date(2025, 1, 1))
    usage_records_upsert(records=[
        dataclasses.replace(acct(account="vision", user="alice", start=at(2026, 1, 5, 10), hours=2, gpus=2, job_id=501), name=LONG_NAME),
        acct(account="vision", user="bob", start=at(2026, 1, 7, 23, 30), hours=1, gpus=1, job_id=502),
    ])  # fmt: skip
    return world


def _pages(client, url):
    html = client.get(f"{url}/").content.decode()
    response = client.get(f"{url}.pdf")
    assert response.status_code == 200 and response["Content-Type"] == "application/pdf"
    return html, pdf_text(response.content), response.content


def test_the_pdf_prints_chinese_and_polish_names_in_full(chinese_team, client_for):
    html, text, _ = _pages(client_for("finance"), "/accounting/invoices/vision/2026-01")
    for shown in (html, text):
        assert "视觉组" in shown
        assert LONG_NAME in shown
    assert "?" not in text.split("\n", 1)[0]  # the title line: "Invoice: 视觉组, January 2026"


def test_pdf_and_page_show_the_same_local_times_in_the_site_zone(chinese_team, client_for):
    html, text, _ = _pages(client_for("finance"), "/accounting/invoices/vision/2026-01")
    # 10:00 UTC is 11:00 in Warsaw; 23:30 UTC on the 7th is 00:30 on the 8th
    for shown in (html, text):
        assert "times in Europe/Warsaw" in shown
        assert "2026-01-05 11:00" in shown and "2026-01-05 13:00" in shown
        assert "2026-01-08 00:30" in shown and "2026-01-05 10:00" not in shown


def test_pdf_and_page_show_the_viewers_own_zone(chinese_team, client_for, world):
    world.finn.profile.time_zone = "Asia/Shanghai"
    world.finn.profile.save()
    html, text, _ = _pages(client_for("finance"), "/accounting/invoices/vision/2026-01")
    for shown in (html, text):
        assert "times in Asia/Shanghai" in shown
        assert "2026-01-05 18:00" in shown and "2026-01-08 07:30" in shown


def test_a_long_invoice_has_every_row_of_the_page_over_several_pages(world, settings, client_for):
    settings.TIME_ZONE = "UTC"
    Rate.objects.create(gpu_type="a100", price_per_gpu_hour=Decimal("8"), effective_from=dt.date(2025, 1, 1))
    usage_records_upsert(records=[
        acct(account="vision", user="alice", start=at(2026, 1, 1 + i % 28, i % 24), hours=1, job_id=7000 + i) for i in range(90)
    ])  # fmt: skip
    html, text, pdf = _pages(client_for("finance"), "/accounting/invoices/vision/2026-01")
    page_rows = set(re.findall(r">(7\d{3})</a>|\b(7\d{3}) <span", html))
    page_ids = {a or b for a, b in page_rows}
    pdf_ids = set(re.findall(r"^\s*(7\d{3}) ", text, re.M))
    assert len(page_ids) == 90 and pdf_ids == page_ids
    pages = re.findall(r"page (\d+) of (\d+)", text)
    assert len(pages) >= 2 and pages[-1][0] == pages[-1][1]
    assert text.count("GPU-hours") >= len(pages)  # the table header repeats on each page
    assert "720.00" in html and "720.00" in text  # 90 GPU-hours × 8

