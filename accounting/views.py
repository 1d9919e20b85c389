"""Pages of accounting: rates, cost reports (admins and finance), a team's usage, monthly invoices."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from accounting.charging import booking_charge_mode
from accounting.forms import CostReportForm, DateRangeForm, RateForm
from accounting.invoices import invoice, invoice_jobs_csv, invoice_pdf
from accounting.models import IssuedInvoice, Rate
from accounting.reports import report_page_data, rows_to_csv
from accounting.selectors import (
    billing_date,
    can_read_invoice,
    can_see_user_breakdown,
    billing_midnight,
    cost_report,
    idle_savings_by_team,
    month_start,
    rates_current,
    usage_teams_visible_to,
)
from accounting.services import invoice_issue, last_closed_month, may_issue_invoices, may_set_prices, rate_create
from portal.exceptions import ApplicationError, form_add_application_error, page_button
from portal.roles import can_read_cost_reports, is_admin


@login_required
def rate_list(request):
    """Everyone logged in reads the prices in force; admins add a rate (effective from a date)."""
    admin = may_set_prices(request.user)
    form = RateForm(initial={"effective_from": billing_date(timezone.now())}) if admin else None
    if request.method == "POST":
        if not admin:
            raise PermissionDenied("Only admins set prices.")  # before the form: no form errors for them
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
        return render(request, "accounting/reports.html", {"form": form, "billing_tz": settings.TIME_ZONE}, status=400)
    cleaned = form.cleaned_data
    span = cleaned["range"]  # the API's rule (accounting.forms.report_range): days or any ISO datetimes
    if request.GET.get("format") == "csv":
        rows = cost_report(start_at=span.start_at, end_at=span.end_at, group_by=cleaned["group_by"], cluster=cleaned.get("cluster") or "")
        response = HttpResponse(rows_to_csv(rows), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{span.csv_filename(cleaned["group_by"])}"'
        return response
    data = report_page_data(start_at=span.start_at, end_at=span.end_at)
    return render(
        request,
        "accounting/reports.html",
        {"form": form, "range": span, "data": data, "billing_tz": settings.TIME_ZONE,
         "csv_links": [(label, span.query(group_by=group_by, format="csv")) for group_by, label in
                       (("team", "by team"), ("user", "by user"), ("gpu_type", "by GPU type"), ("month", "by month"))]},
    )  # fmt: skip


def _team_chosen(request, teams: list):
    """The team a per-team page shows: ``?team=<slug>`` among ``teams`` (the ones the user may see
    there), else the first; 404 when the user sees none or the slug is not one of them."""
    if not teams:
        raise Http404("No team.")
    slug = request.GET.get("team")
    team = next((t for t in teams if t.slug == slug), None) if slug else teams[0]
    if team is None:
        raise Http404("No such team.")
    return team


@login_required
def team_usage(request):
    """The caller's team's usage and cost per month (managers, admins, finance: also per user)."""
    teams = list(usage_teams_visible_to(request.user).order_by("name"))
    team = _team_chosen(request, teams)
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
    # what the team's idle-GPU policy saved in the range (its cancels: GPU-hours left to the time limits)
    saved = idle_savings_by_team(start_at=billing_midnight(start), end_at=billing_midnight(end + dt.timedelta(days=1)), team_ids=[team.pk])
    return render(
        request,
        "accounting/usage.html",
        {"form": form, "teams": teams, "team": team, "months": months, "users": users, "start": start, "end": end,
         "can_read_invoice": can_read_invoice(request.user, team), "currency": settings.DEFAULT_CURRENCY,
         "idle_saved": saved.get(team.pk)},
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
    data = invoice(team=team, month=first)
    closed = first <= last_closed_month()
    return render(request, "accounting/invoice.html", {
        "invoice": data, "can_issue": closed and data["issued"] is None and may_issue_invoices(request.user),
        "closed": closed,
    })  # fmt: skip


@login_required
@require_POST
def invoice_issue_view(request, slug: str, month: str):
    """Issue the month's invoice (admins and finance): its figures and PDF kept as sent."""
    team, first = _invoice_target(request, slug, month)

    def act() -> str:
        row = invoice_issue(user=request.user, team=team, month=first, request=request)
        return f"Invoice {row.number} issued: {row.total:.2f} {row.currency}."

    return page_button(request, act, then=reverse("accounting:invoice", args=[team.slug, f"{first:%Y-%m}"]))


@login_required
def invoice_pdf_view(request, slug: str, month: str):
    """The invoice as a PDF: the one issued (as it was sent), else the month's figures now."""
    team, first = _invoice_target(request, slug, month)
    issued = IssuedInvoice.objects.filter(team=team, period=first).only("pdf").first()
    pdf = bytes(issued.pdf) if issued else invoice_pdf(invoice(team=team, month=first), request=request)
    response = HttpResponse(pdf, content_type="application/pdf")
    response["Content-Disposition"] = f'inline; filename="invoice-{team.slug}-{first:%Y-%m}.pdf"'
    return response


@login_required
def invoice_jobs_csv_view(request, slug: str, month: str):
    """The invoice's jobs, one row per usage slice (streamed: a busy team's month is tens of thousands)."""
    team, first = _invoice_target(request, slug, month)
    response = StreamingHttpResponse(invoice_jobs_csv(team=team, month=first), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="invoice-{team.slug}-{first:%Y-%m}-jobs.csv"'
    return response


# ---------------------------------------------------------------- bookings


def _week_start(value: str | None) -> dt.date:
    today = timezone.localdate()
    try:
        day = dt.date.fromisoformat(value) if value else today
    except ValueError:
        day = today
    return day - dt.timedelta(days=day.weekday())


def _calendar(week: dt.date, clusters: tuple[str, ...]) -> dict:
    """A week as days × hours per GPU type of each cluster: each cell the fewest free GPUs in that
    hour (from accounting.selectors.booking_availability), as a share of capacity for its colour."""
    from accounting.selectors import booking_availability

    zone = timezone.get_current_timezone()
    start = dt.datetime.combine(week, dt.time(0), tzinfo=zone)
    end = start + dt.timedelta(days=7)
    now = timezone.now()
    types = []
    for cluster, row in ((name, row) for name in clusters for row in booking_availability(start=start, end=end, cluster=name)):
        steps = row["steps"]
        days = []
        for d in range(7):
            cells = []
            for h in range(24):
                a = dt.datetime.combine(week + dt.timedelta(days=d), dt.time(h), tzinfo=zone)
                b = a + dt.timedelta(hours=1)
                free = min((s["free"] for s in steps if s["start"] < b and s["end"] > a), default=row["capacity"])
                level = "full" if free == 0 else ("some" if free < row["capacity"] else "free")
                cells.append({"at": a, "free": free, "level": level, "past": b <= now})
            days.append({"date": week + dt.timedelta(days=d), "cells": cells})
        types.append({**row, "cluster": cluster, "days": days})
    return {"week": week, "prev": week - dt.timedelta(days=7), "next": week + dt.timedelta(days=7),
            "types": types, "hours": range(24), "zone": timezone.get_current_timezone_name(),
            "several_clusters": len(clusters) > 1}  # fmt: skip


@login_required
def booking_list(request):
    """The bookings calendar: free GPUs per type over a week (htmx changes the week), the team's
    bookings with cancel/approve/reject buttons, and the booking form (managers and admins). With
    several clusters: the calendar per cluster, a cluster picker and a cluster column."""
    from accounting.forms import BookingForm
    from accounting.selectors import booking_availability, bookings_visible_to
    from accounting.services import booking_create, bookings_whole_nodes
    from portal.selectors import teams_managed_by
    from portal.services import cluster_row
    from portal.slurm import configured_clusters

    clusters = tuple(config.name for config in configured_clusters())
    week = _week_start(request.GET.get("week"))
    calendar = _calendar(week, clusters)
    if request.htmx and request.method == "GET":
        return render(request, "partials/accounting_booking_calendar.html", {"calendar": calendar})
    teams = teams_managed_by(request.user).filter(active=True).order_by("name")
    now = timezone.now()
    capacity = {name: booking_availability(start=now, end=now + dt.timedelta(minutes=1), cluster=name) for name in clusters}
    gpu_types = sorted({row["gpu_type"] for rows in capacity.values() for row in rows})
    if len(clusters) == 1:
        whole = clusters if bookings_whole_nodes() else ()
    else:
        whole = tuple(name for name in clusters if bookings_whole_nodes(cluster_row(name)))
    per_node = min((row["gpus_per_node"] for name in whole for row in capacity[name]), default=None)
    types_on = {name: sorted({row["gpu_type"] for row in capacity[name]}) for name in clusters}
    form_args = {"teams": teams, "gpu_types": gpu_types, "gpus_per_node": per_node, "clusters": clusters,
                 "whole_nodes_on": whole if len(whole) < len(clusters) else (), "types_on": types_on}  # fmt: skip
    form = None
    if teams.exists():
        start = (timezone.localtime(now) + dt.timedelta(minutes=5)).replace(second=0, microsecond=0)
        initial = {"start": start, "end": start + dt.timedelta(hours=2)}
        if len(clusters) > 1 and gpu_types:  # a cluster that has the first GPU type: never "on several clusters; name one"
            initial["cluster"] = next((name for name in clusters if gpu_types[0] in types_on[name]), "")
        form = BookingForm(**form_args, initial=initial)
    if request.method == "POST":
        if form is None:
            raise PermissionDenied("Only team managers and admins book GPUs.")
        form = BookingForm(request.POST, **form_args)
        if form.is_valid():
            data = form.cleaned_data
            try:
                booking = booking_create(team=data["team"], gpu_type=data["gpu_type"], gpus=data["gpus"], start=data["start"],
                                         end=data["end"], note=data["note"], actor=request.user, request=request,
                                         cluster=data["cluster"] or None)  # fmt: skip
            except ApplicationError as exc:
                form_add_application_error(form, exc)
            else:
                if booking.status == "approved":
                    messages.success(request, f"Booked: {booking.gpus} × {booking.gpu_type}; reservation {booking.reservation_name}.")
                else:
                    messages.info(request, f"Requested {booking.gpu_hours} GPU-hours: an admin will approve it.")
                return redirect(f"{request.path}?week={_week_start(timezone.localtime(booking.start).date().isoformat())}")
    bookings = (bookings_visible_to(request.user).select_related("cluster").filter(end__gt=now - dt.timedelta(days=7))
                .order_by("start")[:200])  # fmt: skip
    managed = set(teams.values_list("pk", flat=True))
    return render(request, "accounting/booking_list.html", {
        "calendar": calendar, "form": form, "bookings": bookings, "managed": managed, "now": now,
        "several_clusters": len(clusters) > 1,
        "is_admin": is_admin(request.user), "auto_approve": settings.BOOKING_AUTO_APPROVE_GPU_HOURS,
        "charge_mode": booking_charge_mode(),
    }, status=400 if request.method == "POST" else 200)  # fmt: skip


def _booking_action(request, booking_id, action):
    from accounting.selectors import bookings_visible_to
    from accounting.services import booking_approve, booking_cancel, booking_reject

    if request.method != "POST":
        from django.http import HttpResponseNotAllowed

        return HttpResponseNotAllowed(["POST"])
    booking = bookings_visible_to(request.user).filter(pk=booking_id).first()
    if booking is None:
        raise Http404
    note = (request.POST.get("note") or "")[:500]

    def act() -> str:
        if action == "cancel":
            booking_cancel(booking=booking, actor=request.user, request=request)
        elif action == "approve":
            booking_approve(booking=booking, actor=request.user, note=note, request=request)
        else:
            booking_reject(booking=booking, actor=request.user, note=note, request=request)
        return f"Booking {booking.reservation_name}: {action} done."

    return page_button(request, act, then="accounting:bookings")


@login_required
def booking_cancel_view(request, booking_id):
    return _booking_action(request, booking_id, "cancel")


@login_required
def booking_approve_view(request, booking_id):
    return _booking_action(request, booking_id, "approve")


@login_required
def booking_reject_view(request, booking_id):
    return _booking_action(request, booking_id, "reject")


# ---------------------------------------------------------------- quotas and budgets


@login_required
def quota_list(request):
    """Quotas of the teams the user sees (history included), the request form (managers of a team;
    admins) and approve/reject buttons (admins)."""
    from django.core.paginator import Paginator

    from accounting.forms import QuotaRequestForm
    from accounting.selectors import quotas_visible_to
    from accounting.services import quota_request
    from portal.models import NodeInfo
    from portal.selectors import teams_managed_by

    teams = teams_managed_by(request.user).filter(active=True).order_by("name")
    gpu_types = sorted(set(NodeInfo.objects.exclude(gpu_type="").values_list("gpu_type", flat=True)))
    form = QuotaRequestForm(teams=teams, gpu_types=gpu_types) if teams.exists() else None
    if request.method == "POST":
        if form is None:
            raise PermissionDenied("Only team managers and admins request quotas.")
        form = QuotaRequestForm(request.POST, teams=teams, gpu_types=gpu_types)
        if form.is_valid():
            data = form.cleaned_data
            try:
                quota = quota_request(
                    team=data["team"], user=request.user, gpu_hours=data["gpu_hours"], gpu_type=data["gpu_type"],
                    max_gpus=data["max_gpus"], period_start=data["period_start"], period_end=data["period_end"],
                    justification=data["justification"], request=request,
                )  # fmt: skip
            except ApplicationError as exc:
                form_add_application_error(form, exc)
            else:
                messages.success(request, f"Quota requested: {quota.gpu_hours} GPU-h for {quota.team.name} in {quota.period_label}.")
                return redirect("accounting:quotas")
    queryset = quotas_visible_to(request.user).order_by("-period_start", "-requested_at", "-pk")
    if request.GET.get("state"):
        queryset = queryset.filter(state=request.GET["state"])
    page = Paginator(queryset, 50).get_page(request.GET.get("page"))
    return render(request, "accounting/quota_list.html",
                  {"page": page, "form": form, "is_admin": is_admin(request.user), "billing_tz": settings.TIME_ZONE,
                   "managed": set(teams_managed_by(request.user).values_list("pk", flat=True))},
                  status=400 if request.method == "POST" else 200)  # fmt: skip


def _quota_decision(request, quota_id: int, decide):
    from accounting.forms import QuotaDecisionForm
    from accounting.selectors import quotas_visible_to

    if request.method != "POST":
        from django.http import HttpResponseNotAllowed

        return HttpResponseNotAllowed(["POST"])
    quota = get_object_or_404(quotas_visible_to(request.user), pk=quota_id)
    if not is_admin(request.user):
        raise PermissionDenied("Only admins decide on quotas.")
    form = QuotaDecisionForm(request.POST)
    comment = form.cleaned_data["comment"] if form.is_valid() else ""

    def act() -> str:
        done = decide(quota=quota, user=request.user, comment=comment, request=request)
        return f"Quota {done.pk} ({done.team.name}, {done.period_label}) {done.get_state_display().lower()}."

    return page_button(request, act, then="accounting:quotas")


@login_required
def quota_approve_view(request, quota_id: int):
    from accounting.services import quota_approve

    return _quota_decision(request, quota_id, quota_approve)


@login_required
def quota_reject_view(request, quota_id: int):
    from accounting.services import quota_reject

    return _quota_decision(request, quota_id, quota_reject)


@login_required
@require_POST
def quota_withdraw_view(request, quota_id: int):
    """"Withdraw" on the quota list: a request awaiting approval, by its team's managers and admins."""
    from accounting.selectors import quotas_visible_to
    from accounting.services import quota_cancel

    quota = get_object_or_404(quotas_visible_to(request.user), pk=quota_id)

    def act() -> str:
        done = quota_cancel(quota=quota, user=request.user, request=request, withdraw=True)
        return f"Quota request withdrawn ({done.team.name}, {done.period_label})."

    return page_button(request, act, then="accounting:quotas")


@login_required
def budget(request):
    """A team's GPU budget this period: budget, used, held, booked, remaining per GPU type, and a
    burn-down chart (GPU-hours left per day against the ideal straight line)."""
    from accounting.apis import team_budget_data
    from accounting.selectors import budget_burndown
    from portal.selectors import teams_visible_to

    teams = list(teams_visible_to(request.user).order_by("name"))
    team = _team_chosen(request, teams)
    data = team_budget_data(team)
    head = next((r for r in data["rows"] if not r["gpu_type"]), data["rows"][0] if data["rows"] else None)
    chart = budget_burndown(quota=head["quota"]) if head else None
    # GPU-hours paid beside busy (GPU monitoring) and the cost of the idle ones, this period so far
    paid_busy = None
    if head:
        last_day = min(billing_date(timezone.now()), head["period_end"] - dt.timedelta(days=1))
        paid_busy = cost_report(start=head["period_start"], end=last_day, group_by="gpu_type", team=team)
    return render(request, "accounting/budget.html",
                  {"teams": teams, "team": team, "data": data, "head": head, "chart": chart,
                   "paid_busy": paid_busy, "paid_currency": settings.DEFAULT_CURRENCY, "billing_tz": settings.TIME_ZONE})  # fmt: skip
