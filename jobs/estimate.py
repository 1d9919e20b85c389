"""The estimate of a job: the GPU-hours Slurm will allocate at most (GPUs of one job × its time limit
× its array tasks; ``--exclusive`` counts every GPU of its nodes) and their cost at the rate in
force. The same figure is the budget hold, the form's estimate, the API quote and the CLI's quote."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from django.utils import timezone

from accounting.rates import RateBook, gpu_hour_price
from jobs.spec import ValidSpec

TWO_PLACES = Decimal("0.01")


@dataclass(frozen=True)
class JobQuote:
    """GPU-hours and cost a job may use at most (its time limit × the GPUs of all its tasks)."""

    gpu_hours: Decimal
    gpu_type: str  # the type priced ("" when no type could be priced)
    gpu_type_assumed: bool  # True when the job accepts any type and the dearest one was priced
    price_per_gpu_hour: Decimal | None
    cost: Decimal | None  # None: no rate known
    currency: str
    note: str


def _price_of(*, gpu_type: str, partition: str, at: dt.datetime, book: RateBook) -> tuple[Decimal, str] | None:
    """accounting.rates.gpu_hour_price: the price in force and its currency, or None (no rate)."""
    return gpu_hour_price(gpu_type=gpu_type, partition=partition, at=at, book=book)


def job_gpu_hours(spec: ValidSpec) -> Decimal:
    """GPUs × time limit × array tasks, in GPU-hours (the ``%`` throttle does not reduce it)."""
    return (Decimal(spec.gpus * spec.array_tasks) * Decimal(spec.time_limit_minutes) / Decimal(60)).quantize(
        TWO_PLACES, ROUND_HALF_UP
    )


def quote_for(spec: ValidSpec, *, at: dt.datetime | None = None, cache: dict | None = None) -> JobQuote:
    """``cache``: a dict kept across the specs of one batch (prices read once per type and partition)."""
    at = at or timezone.now()
    cache = {} if cache is None else cache

    def price_of(gpu_type: str) -> tuple[Decimal, str] | None:
        if ("price", gpu_type, spec.partition) not in cache:
            if "rates" not in cache:
                cache["rates"] = RateBook.current()  # one look at the rate book's version per quote (or batch)
            cache[("price", gpu_type, spec.partition)] = _price_of(
                gpu_type=gpu_type, partition=spec.partition, at=at, book=cache["rates"]
            )
        return cache[("price", gpu_type, spec.partition)]

    gpu_hours = job_gpu_hours(spec)
    shape = f"{spec.gpus} GPU × {spec.time_limit_minutes} min"
    if spec.array_tasks > 1:
        shape += f" × {spec.array_tasks} array tasks"
    if spec.exclusive:
        shape += " (--exclusive: every GPU of the node)"
    types = [spec.gpu_type] if spec.gpu_type else spec.capacity.gpu_types
    priced = [(t, p) for t in types if (p := price_of(t)) is not None]
    if not priced:
        note = f"{shape}; no GPU-hour rate is set for this GPU type: cost unknown."
        return JobQuote(gpu_hours, spec.gpu_type, False, None, None, "", note)
    gpu_type, (price, currency) = max(priced, key=lambda item: item[1][0])
    assumed = not spec.gpu_type
    cost = (gpu_hours * price).quantize(TWO_PLACES, ROUND_HALF_UP)
    note = f"{shape} at {price} {currency}/GPU-hour."
    if assumed:
        note = f"Any GPU type: estimated at the most expensive type in partition {spec.partition} ({gpu_type}). " + note
    return JobQuote(gpu_hours, gpu_type, assumed, price, cost, currency, note)
