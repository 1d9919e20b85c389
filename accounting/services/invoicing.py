"""Issuing a team's monthly invoice: the figures and the PDF as sent, kept (IssuedInvoice), so that
a late record or a re-pricing of the month afterwards never changes what the team was billed; the
difference is billed once, on the team's next issued invoice (accounting.invoices: adjustments).

Admins and finance issue; only a closed month (USAGE_MONTH_CLOSE_DAYS after its end, as the roll-up
has it: the records of jobs that ended at its end are in), once per team and month."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounting.calendar import month_start
from accounting.invoices import invoice, invoice_pdf
from accounting.models import IssuedInvoice
from accounting.selectors.usage_totals import month_rolled
from accounting.services.usage_rollup import last_closed_month, usage_month_roll
from portal.exceptions import ApplicationError, Conflict
from portal.models import Team
from portal.roles import can_read_cost_reports
from portal.services import audit_record


def may_issue_invoices(user) -> bool:
    """Admins and finance (who read the cost reports) issue invoices."""
    return can_read_cost_reports(user)


def invoice_number(team: Team, period: dt.date) -> str:
    return f"GP-{period:%Y%m}-{team.slug}"[:64]


def invoice_issue(*, user, team: Team, month: dt.date, request=None, now: dt.datetime | None = None) -> IssuedInvoice:
    """Issue ``team``'s invoice for ``month``: roll the month if its totals are not current, take the
    figures (with the adjustments of earlier issued months revised since), render the PDF, and store
    both. 403 for anyone but admins and finance; 400 for a month not closed yet; 409 when it was
    issued already, or when another month of the team was issued meanwhile (its adjustments could
    then be carried twice: issue again)."""
    if not may_issue_invoices(user):
        raise ApplicationError("Only admins and finance issue invoices.", status_code=403)
    now = now or timezone.now()
    period = month_start(month)
    if period > last_closed_month(now):
        raise ApplicationError(
            f"{period:%Y-%m} is not closed yet: its invoice can be issued once the month has closed "
            f"({settings.USAGE_MONTH_CLOSE_DAYS} days after its end).",
            errors={"month": [f"{period:%Y-%m} is not closed yet."]},
        )
    if IssuedInvoice.objects.filter(team=team, period=period).exists():
        raise Conflict(f"The invoice for {period:%Y-%m} was issued already.", errors={"month": ["Issued already."]})
    if not month_rolled(period):
        usage_month_roll(period=period, now=now)
    seen = set(IssuedInvoice.objects.filter(team=team).values_list("pk", flat=True))
    data = invoice(team=team, month=period)
    number = invoice_number(team, period)
    row = IssuedInvoice(
        team=team, period=period, number=number, issued_at=now, issued_by=user if user.is_authenticated else None,
        currency=data["currency"], usage_cost=data["usage_cost"], bookings_cost=data["bookings_cost"],
        adjustments_cost=data["adjustments_cost"], total=data["total"],
        adjustments=[{"period": a["period"].isoformat(), "amount": str(a["amount"])} for a in data["adjustments"]],
    )  # fmt: skip
    data["issued"] = row  # the PDF says it is the issued invoice, with its number and date
    row.pdf = invoice_pdf(data, request=request)
    try:
        with transaction.atomic():
            # another invoice of the team issued since the figures were taken: the adjustments it
            # carried may be this one's too — refuse rather than bill them twice. The team's row
            # (FOR NO KEY UPDATE: a submission's budget lock does not wait) orders two issues.
            Team.objects.select_for_update(no_key=True).filter(pk=team.pk).first()
            if set(IssuedInvoice.objects.filter(team=team).values_list("pk", flat=True)) != seen:
                raise Conflict("Another invoice of this team was issued meanwhile: issue this one again.",
                               errors={"month": ["Another invoice of this team was issued meanwhile."]})  # fmt: skip
            row.save(force_insert=True)
            audit_record(actor=user, action="invoice.issue", target=row, team=team, request=request,
                         data={"number": number, "period": period.isoformat(), "total": str(row.total),
                               "adjustments": row.adjustments})  # fmt: skip
    except IntegrityError:
        raise Conflict(f"The invoice for {period:%Y-%m} was issued already.", errors={"month": ["Issued already."]}) from None
    return row
