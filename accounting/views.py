"""Pages of accounting: rates, cost reports (admins and finance), a team's usage, monthly invoices."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone

from accounting.forms import CostReportForm, DateRangeForm, RateForm
from accounting.invoices import invoice, invoice_pdf
from accounting.reports import report_page_data, rows_to_csv
from accounting.selectors import (
    billing_date,
    can_read_invoice,
    can_see_user_breakdown,
    cost_report,
    month_start,
    rates_current,
    usage_teams_visible_to,
)
from accounting.models import Rate
from accounting.services import rate_create
from portal.exceptions import ApplicationError, form_add_application_error
from portal.roles import can_read_cost_reports, is_admin


@login_required
def rate_list(request):
    """Everyone logged in reads the prices in force; admins add a rate (effective from a date)."""
    admin = is_admin(request.user)
    form = RateForm(initial={"effective_from": billing_date(timezone.now())}) if admin else None
    if request.method == "POST":
        if not admin:
            raise PermissionDenied("Only admins set prices.")
        form = RateForm(request.POST)
        if form.is_valid():
            try:
                rate = rate_create(**form.cleaned_data, created_by=request.user)
            except ApplicationError as exc:
                form_add_application_error(form, exc)
            else:
                messages.success(request, f"Rate added: {rate}.")
                return redirect("accounting:rates")
    history = Rate.objects.select_related("created_by").order_by("gpu_type", "partition", "-effective_from") if admin else None
    return render(
        request,
        "accounting/rates.html",
        {"rates": rates_current(), "today": billing_date(timezone.now()), "form": form, "history": history,
         "billing_tz": settings.TIME_ZONE},
    )


@login_required
def report(request):
    if not can_read_cost_reports(request.user):
        raise PermissionDenied("Cost reports are for admins and finance.")
    form = CostReportForm(request.GET)  # every field optional: an empty query means this month so far
    if not form.is_valid():
        return render(request, "accounting/reports.html", {"form": form}, status=400)
    cleaned = form.cleaned_data
    start, end = cleaned["start"], cleaned["end"]
    if request.GET.get("format") == "csv":
        rows = cost_report(start=start, end=end, group_by=cleaned["group_by"])
        response = HttpResponse(rows_to_csv(rows), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="cost-{cleaned["group_by"]}-{start}-{end}.csv"'
        return response
    data = report_page_data(start=start, end=end)
    invoice_month = month_start(start)
    return render(
        request,
        "accounting/reports.html",
        {"form": form, "start": start, "end": end, "data": data, "invoice_month": invoice_month,
         "billing_tz": settings.TIME_ZONE},
    )


@login_required
def team_usage(request):
    """The caller's team's usage and cost per month (managers, admins, finance: also per user)."""
    teams = list(usage_teams_visible_to(request.user).order_by("name"))
    if not teams:
        raise Http404("No team.")
    slug = request.GET.get("team")
    team = next((t for t in teams if t.slug == slug), None) if slug else teams[0]
    if team is None:
        raise Http404("No such team.")
    today = billing_date(timezone.now())
    first = month_start(today)
    for _ in range(11):
        first = month_start(first - dt.timedelta(days=1))
    form = DateRangeForm(request.GET, default=(first, today))
    if not form.is_valid():
        return render(request, "accounting/usage.html", {"form": form, "teams": teams, "team": team}, status=400)
    start, end = form.cleaned_data["start"], form.cleaned_data["end"]
    months = cost_report(start=start, end=end, group_by="month", team=team)
    users = cost_report(start=start, end=end, group_by="user", team=team) if can_see_user_breakdown(request.user, team) else None
    return render(
        request,
        "accounting/usage.html",
        {"form": form, "teams": teams, "team": team, "months": months, "users": users, "start": start, "end": end,
         "can_read_invoice": can_read_invoice(request.user, team)},
    )  # fmt: skip


def _invoice_target(request, slug: str, month: str):
    team = get_object_or_404(usage_teams_visible_to(request.user), slug=slug)
    if not can_read_invoice(request.user, team):
        raise PermissionDenied("Invoices are for the team's managers, admins and finance.")
    try:
        first = dt.datetime.strptime(month, "%Y-%m").date()
    except ValueError:
        raise Http404("Month must be YYYY-MM.") from None
    return team, first


@login_required
def invoice_html(request, slug: str, month: str):
    team, first = _invoice_target(request, slug, month)
    return render(request, "accounting/invoice.html", {"invoice": invoice(team=team, month=first)})


@login_required
def invoice_pdf_view(request, slug: str, month: str):
    team, first = _invoice_target(request, slug, month)
    response = HttpResponse(invoice_pdf(invoice(team=team, month=first)), content_type="application/pdf")
    response["Content-Disposition"] = f'inline; filename="invoice-{team.slug}-{first:%Y-%m}.pdf"'
    return response
