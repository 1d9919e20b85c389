"""The billing calendar: the one owner of "which day / month is it" for accounting.

Calendar months, rates' effective dates, quota periods, invoices, month slices and the sreport
reconciliation all count in the billing time zone (settings.TIME_ZONE, UTC by default). Pure
functions, no queries."""

from __future__ import annotations

import datetime as dt
import zoneinfo

from django.conf import settings
from django.utils import timezone


def billing_zone() -> zoneinfo.ZoneInfo:
    """The time zone of calendar months and of rates' effective dates: settings.TIME_ZONE (UTC by
    default). Invoices, month slices, rate changes and the sreport reconciliation all use it."""
    return zoneinfo.ZoneInfo(settings.TIME_ZONE)


def billing_date(at: dt.datetime) -> dt.date:
    if timezone.is_naive(at):
        raise ValueError("an aware datetime is needed")
    return at.astimezone(billing_zone()).date()


def billing_midnight(day: dt.date) -> dt.datetime:
    """00:00 of ``day`` in the billing time zone, as an aware datetime."""
    return dt.datetime(day.year, day.month, day.day, tzinfo=billing_zone())


def month_start(day: dt.date) -> dt.date:
    return day.replace(day=1)


def next_month(day: dt.date) -> dt.date:
    """The first day of the month after ``day``'s."""
    return dt.date(day.year + (day.month == 12), day.month % 12 + 1, 1)


def current_month(at: dt.datetime | None = None) -> tuple[dt.date, dt.date]:
    """The calendar month (billing time zone) containing ``at``: (first day, first day of the next)."""
    first = month_start(billing_date(at or timezone.now()))
    return first, next_month(first)


def range_bounds(start: dt.date, end: dt.date) -> tuple[dt.datetime, dt.datetime]:
    """[00:00 of start, 00:00 of the day after end) in the billing time zone: ``end`` is inclusive."""
    return billing_midnight(start), billing_midnight(end + dt.timedelta(days=1))


def month_starts(start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    """Month boundaries (00:00 of the 1st, billing time zone) strictly inside (start, end)."""
    zone = billing_zone()
    local = start.astimezone(zone)
    year, month = local.year, local.month
    points = []
    while True:
        month += 1
        if month == 13:
            year, month = year + 1, 1
        boundary = dt.datetime(year, month, 1, tzinfo=zone)
        if boundary >= end:
            return points
        points.append(boundary)
