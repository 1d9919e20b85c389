"""The estimate of a job: the most Slurm can charge it, in GPU-seconds (GPUs of one job × (its time
limit + how far past it the cluster lets a job run: OverTimeLimit, the time-limit check, KillWait;
jobs.inventory.overrun_seconds) × its array tasks; ``--exclusive`` and OverSubscribe=EXCLUSIVE
partitions count every GPU of the nodes) and their cost at the rate in force. The same figure is the
budget hold, the form's estimate, the API quote and the CLI's quote. GPU-hours and cost are kept to
six places, rounded up (a hold is never below the charge); pages and the API round them for display."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal

from django.utils import timezone

from accounting.rates import RateBook, gpu_hour_price
from jobs.constraints import unmatched
from jobs.spec import ValidSpec
from portal import money


@dataclass(frozen=True)
class JobQuote:
    """GPU-seconds (and GPU-hours, six places rounded up) and cost a job may be charged at most
    (its time limit plus the cluster's overrun × the GPUs of all its tasks)."""

    gpu_hours: Decimal
    gpu_type: str  # the type priced ("" when no type could be priced)
    gpu_type_assumed: bool  # True when the job accepts any type and the dearest one was priced
    price_per_gpu_hour: Decimal | None
    cost: Decimal | None  # None: no rate known
    currency: str
    note: str
    gpu_seconds: int = 0  # exact: what gpu_hours is rounded up from
    overrun_seconds: int = 0  # per task, past the time limit (included)
    gpu_types: tuple[str, ...] = ()  # the types the job can land on (the one asked; without one, the partition's)


def _price_of(*, gpu_type: str, partition: str, at: dt.datetime, book: RateBook) -> tuple[Decimal, str] | None:
    """accounting.rates.gpu_hour_price: the price in force and its currency, or None (no rate)."""
    return gpu_hour_price(gpu_type=gpu_type, partition=partition, at=at, book=book)


def job_gpu_seconds(spec: ValidSpec) -> int:
    """GPUs × (time limit + the partition's overrun) × array tasks, in GPU-seconds (the ``%``
    throttle does not reduce it)."""
    per_task = spec.time_limit_minutes * 60 + (spec.capacity.overrun_seconds or 0)
    return spec.gpus * spec.array_tasks * per_task


def gpu_hours_of(gpu_seconds: int) -> Decimal:
    """GPU-seconds as GPU-hours to six places, rounded up (holds and estimates: never below the charge)."""
    return money.stored(money.gpu_hours(gpu_seconds), up=True)


def landing_types(spec: ValidSpec) -> tuple[str, ...]:
    """The GPU types a job can get: the one it asks for; without one, the types of the partition's
    nodes its ``--constraint`` can match (every type of the partition when no single node matches a
    constraint that spans nodes, or one this reading cannot judge)."""
    if spec.gpu_type:
        return (spec.gpu_type,)
    nodes = spec.capacity.eligible_nodes("")
    if spec.constraint:
        matching = [n for n in nodes if unmatched(spec.constraint, [n.features]) == []]
        nodes = matching or nodes
    return tuple(sorted({n.gpu_type for n in nodes if n.gpu_type}))



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

    gpu_seconds = job_gpu_seconds(spec)
    gpu_hours = gpu_hours_of(gpu_seconds)
    overrun = spec.capacity.overrun_seconds or 0
    shape = f"{spec.gpus} GPU × ({spec.time_limit_minutes} min + {overrun} s Slurm may run past the limit)"
    if spec.array_tasks > 1:
        shape += f" × {spec.array_tasks} array tasks"
    if spec.capacity.exclusive:
        shape += f" (partition {spec.partition} is OverSubscribe=EXCLUSIVE: every GPU of the node)"
    elif spec.exclusive:
        shape += " (--exclusive: every GPU of the node)"
    types = landing_types(spec)
    priced = [(t, p) for t in types if (p := price_of(t)) is not None]
    if not priced:
        note = f"{shape}; no GPU-hour rate is set for this GPU type: cost unknown."
        return JobQuote(gpu_hours, spec.gpu_type, False, None, None, "", note, gpu_seconds, overrun, types)
    gpu_type, (price, currency) = max(priced, key=lambda item: item[1][0])
    assumed = not spec.gpu_type
    # exact GPU-seconds × price, rounded once (1 GPU × 2 min × 4 tasks at 8/GPU-h: 1.07, not 0.13 h × 8 = 1.04);
    # up, to six places: the hold never below the charge; pages show two
    cost = money.stored(money.cost(gpu_seconds=gpu_seconds, price=price), up=True)
    note = f"{shape} at {price} {currency}/GPU-hour."
    if assumed:
        note = f"Any GPU type: estimated at the most expensive type in partition {spec.partition} ({gpu_type}). " + note
    if assumed and len(types) > 1:
        note += f" Held against the quotas of every type it can land on ({', '.join(types)}); charged at the type Slurm allocates."
    return JobQuote(gpu_hours, gpu_type, assumed, price, cost, currency, note, gpu_seconds, overrun, types)
