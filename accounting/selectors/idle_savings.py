"""What the idle-GPU policy saved (accounting.models.IdleCancelSaving): per team over a period, for
the cost report and the dashboard. GPU-hours from the exact GPU-seconds and their value at the rate in
force when each job was cancelled (the rate book; portal.money owns the units and the rounding)."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from django.conf import settings

from accounting.models import IdleCancelSaving
from accounting.rates import RateBook
from portal import money


def idle_savings_by_team(*, start_at: dt.datetime, end_at: dt.datetime, team_ids=None) -> dict[int, dict]:
    """{team pk: {"team_slug", "team_name", "jobs", "gpu_seconds", "gpu_hours", "value", "unpriced_gpu_hours", "currency"}} for
    the policy cancels in [start_at, end_at) (``team_ids``: only these teams). ``value``: the saved
    GPU-seconds priced by the rate in force at each cancel (rounded once, for display); hours of a
    type without a rate are counted in ``unpriced_gpu_hours``. One query (and the rate book)."""
    rows = IdleCancelSaving.objects.filter(cancelled_at__gte=start_at, cancelled_at__lt=end_at)
    if team_ids is not None:
        rows = rows.filter(team_id__in=list(team_ids))
    book = RateBook.current()
    pieces: dict[int, list] = defaultdict(list)
    seconds: dict[int, int] = defaultdict(int)
    unpriced: dict[int, int] = defaultdict(int)
    jobs: dict[int, int] = defaultdict(int)
    names: dict[int, tuple[str, str]] = {}
    for team_id, slug, name, gpu_type, gpu_seconds, at in rows.values_list(
        "team_id", "team__slug", "team__name", "gpu_type", "gpu_seconds", "cancelled_at"
    ):
        names[team_id] = (slug, name)
        jobs[team_id] += 1
        seconds[team_id] += gpu_seconds
        rate = book.rate_at(gpu_type, "", at)
        if rate is None:
            unpriced[team_id] += gpu_seconds
        else:
            pieces[team_id].append((gpu_seconds, rate.price_per_gpu_hour))
    return {
        team_id: {
            "team_slug": names[team_id][0], "team_name": names[team_id][1], "jobs": jobs[team_id], "gpu_seconds": seconds[team_id],
            "gpu_hours": money.display(money.gpu_hours(seconds[team_id])),
            "value": money.display(money.total_cost(pieces[team_id])),
            "unpriced_gpu_hours": money.display(money.gpu_hours(unpriced[team_id])),
            "currency": settings.DEFAULT_CURRENCY,
        }
        for team_id in seconds
    }  # fmt: skip
