"""Issued invoices (accounting.services.invoicing): a closed month's invoice is issued once by admins or
finance, its figures and PDF kept as sent; usage recorded after the issue (a late record: the month's
totals revised) never changes it and is billed once, as an adjustment on the team's next issued
invoice; pages and the PDF say which is which."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from accounting.invoices import invoice
from accounting.models import IssuedInvoice, UsageMonth
from accounting.services import invoice_issue, usage_records_upsert, usage_rollup
from portal.exceptions import ApplicationError, Conflict
from tests.accounting.helpers import acct, at
from tests.accounting.test_usage_rollup import CLOSED, FEBRUARY, JANUARY, usage  # noqa: F401 — the fixture

pytestmark = pytest.mark.django_db
MARCH = dt.date(2026, 3, 1)


def test_an_issued_invoice_stays_as_sent_and_late_usage_is_billed_once_on_the_next(usage):
    team = usage.vision
    usage_rollup(now=CLOSED)
    before = invoice(team=team, month=JANUARY)
    issued = invoice_issue(user=usage.finn, team=team, month=JANUARY, now=CLOSED)
    assert bytes(issued.pdf).startswith(b"%PDF") and issued.total == before["total"] and issued.adjustments == []
    assert (issued.usage_cost, issued.number) == (before["usage_cost"], "GP-202601-vision")

    # a late January record, ingested and rolled after the issue
    usage_records_upsert(records=[acct(account="vision", user="dave", start=at(2026, 1, 30, 1), hours=3.5, gpus=8, job_id=999)])
    assert usage_rollup(now=CLOSED + dt.timedelta(days=1)) == [JANUARY]
    assert UsageMonth.objects.get(period=JANUARY).revised_at > issued.issued_at
    now = invoice(team=team, month=JANUARY)
    late = now["revised_since_issue"]
    assert late > 0 and late == sum((Decimal(r["cost"]) for r in now["by_user"]), Decimal(0)).quantize(Decimal("0.01")) - issued.usage_cost
    assert (now["total"], now["usage_cost"], now["issued"].pk) == (issued.total, issued.usage_cost, issued.pk)  # as sent

    # February, not issued yet, bills the difference once
    february = invoice(team=team, month=FEBRUARY)
    assert february["adjustments"] == [{"period": JANUARY, "amount": late}]
    assert february["total"] == february["usage_cost"] + february["bookings_cost"] + late
    carried = invoice_issue(user=usage.admin, team=team, month=FEBRUARY, now=CLOSED + dt.timedelta(days=2))
    assert carried.adjustments == [{"period": "2026-01-01", "amount": str(late)}] and carried.total == february["total"]
    # ... and never again: March (not closed, not issued) owes nothing for January
    assert invoice(team=team, month=MARCH)["adjustments"] == []
    assert invoice(team=team, month=FEBRUARY)["adjustments"] == [{"period": JANUARY, "amount": late}]  # as issued

    with pytest.raises(Conflict):
        invoice_issue(user=usage.finn, team=team, month=JANUARY, now=CLOSED + dt.timedelta(days=3))
    with pytest.raises(ApplicationError) as refused:
        invoice_issue(user=usage.finn, team=team, month=MARCH, now=CLOSED)
    assert refused.value.status_code == 400 and "not closed" in refused.value.errors["month"][0]
    with pytest.raises(ApplicationError) as denied:
        invoice_issue(user=usage.dave, team=usage.nlp, month=JANUARY, now=CLOSED)
    assert denied.value.status_code == 403
    assert IssuedInvoice.objects.count() == 2


def test_the_page_issues_and_the_pdf_is_the_one_sent(usage, client_for):
    usage_rollup(now=CLOSED)
    page = client_for("finance").get("/accounting/invoices/vision/2026-01/").content.decode()
    assert "Issue this invoice" in page
    assert client_for("manager").post("/accounting/invoices/vision/2026-01/issue/").status_code == 403  # the team's manager reads, does not issue
    response = client_for("finance").post("/accounting/invoices/vision/2026-01/issue/", follow=True)
    assert response.status_code == 200 and "Invoice GP-202601-vision issued" in response.content.decode()
    issued = IssuedInvoice.objects.get(team=usage.vision, period=JANUARY)
    assert "Issued as <strong>GP-202601-vision</strong>" in response.content.decode()
    assert "Issue this invoice" not in response.content.decode()
    pdf = client_for("finance").get("/accounting/invoices/vision/2026-01.pdf")
    assert pdf.status_code == 200 and pdf.content == bytes(issued.pdf)
    again = client_for("finance").post("/accounting/invoices/vision/2026-01/issue/", follow=True)
    assert "issued already" in again.content.decode() and IssuedInvoice.objects.filter(team=usage.vision).count() == 1
