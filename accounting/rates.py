"""The rate book: the one owner of "which rate is in force".

A rate takes effect at 00:00 (billing time zone, accounting.calendar) of its ``effective_from`` day
and stays in force until the next rate of the same (gpu_type, partition) starts. A partition-specific
rate in force wins over the generic (partition "") one, even if the generic one is newer. Usage
slices (accounting.services.repricing), job quotes (``gpu_hour_price``), booking charges
(accounting.selectors.bookings.booking_charges) and the rates page (``rates_current``) all ask
``RateBook``; none of them filters Rate rows by date itself."""

from __future__ import annotations

import datetime as dt
from bisect import bisect_right
from collections.abc import Iterable
from decimal import Decimal

from django.utils import timezone

from accounting.calendar import billing_midnight
from accounting.models import Rate
from portal.snapshots import RATES, snapshot


class RateBook:
    """Every rate of some GPU types (one query), answering "which rate applies from when"."""

    def __init__(self, rates: Iterable[Rate]):
        self._by_key: dict[tuple[str, str], list[tuple[dt.datetime, Rate]]] = {}
        for rate in rates:
            self._by_key.setdefault((rate.gpu_type, rate.partition), []).append(
                (billing_midnight(rate.effective_from), rate)
            )
        for items in self._by_key.values():
            items.sort(key=lambda item: item[0])

    @classmethod
    def load(cls, gpu_types: set[str] | None = None) -> RateBook:
        """The rates of ``gpu_types`` (None: every rate). One query (none for an empty set)."""
        if gpu_types is None:
            return cls(Rate.objects.all())
        return cls(Rate.objects.filter(gpu_type__in=gpu_types) if gpu_types else [])

    @classmethod
    def current(cls) -> RateBook:
        """Every rate, as of the last rate_create: this process's copy (portal.snapshots; no query
        while it is current), else one query. Read-only (shared by the process's threads)."""
        return snapshot(RATES, cls.load)

    @staticmethod
    def _at(items: list[tuple[dt.datetime, Rate]], at: dt.datetime) -> Rate | None:
        index = bisect_right([start for start, _ in items], at) - 1
        return items[index][1] if index >= 0 else None

    def rate_at(self, gpu_type: str, partition: str, at: dt.datetime) -> Rate | None:
        """The rate in force at ``at`` for usage of ``gpu_type`` on ``partition`` ("" = the generic rate)."""
        if partition:
            specific = self._at(self._by_key.get((gpu_type, partition), []), at)
            if specific is not None:
                return specific
        return self._at(self._by_key.get((gpu_type, ""), []), at)

    def change_points(self, gpu_type: str, partition: str, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
        """The moments strictly inside (start, end) where the rate of ``gpu_type``/``partition`` may change."""
        keys = [(gpu_type, "")] + ([(gpu_type, partition)] if partition else [])
        return sorted(
            {at for key in keys for at, _ in self._by_key.get(key, []) if start < at < end}
        )

    def current_and_upcoming(self, at: dt.datetime) -> tuple[list[Rate], list[Rate]]:
        """(the rate in force at ``at`` per (gpu_type, partition) key, the rates that start later)."""
        current, upcoming = [], []
        for items in self._by_key.values():
            in_force = self._at(items, at)
            if in_force is not None:
                current.append(in_force)
            upcoming.extend(rate for start, rate in items if start > at)
        return current, upcoming


def gpu_hour_price(
    *, gpu_type: str, partition: str = "", at: dt.datetime, book: RateBook | None = None
) -> tuple[Decimal, str] | None:
    """The price of one GPU-hour of ``gpu_type`` on ``partition`` in force at ``at`` (aware datetime),
    as (price, currency), or None when no rate applies. From ``RateBook.current()``: no query while
    this process's copy is current; ``book``: one already at hand (several prices of one quote)."""
    if timezone.is_naive(at):
        raise ValueError("an aware datetime is needed")
    rate = (book or RateBook.current()).rate_at(gpu_type, partition, at)
    return (rate.price_per_gpu_hour, rate.currency) if rate is not None else None


def rates_current(*, at: dt.datetime | None = None) -> list[Rate]:
    """The rate in force now for every (gpu_type, partition), plus scheduled future ones. One query."""
    current, upcoming = RateBook.load().current_and_upcoming(at or timezone.now())
    return sorted(current, key=lambda r: (r.gpu_type, r.partition)) + sorted(
        upcoming, key=lambda r: (r.effective_from, r.gpu_type)
    )
