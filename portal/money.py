"""Units and money: the one owner of GPU-seconds → GPU-hours → cost and of their rounding.

- Figures are counted exactly: GPU-seconds are whole numbers, prices and costs are Decimals. An hour
  is ``HOUR`` seconds; a cost is GPU-seconds × price / ``HOUR``, multiplied before it is divided (one
  division, at the end), and a sum adds the exact figures before anything is rounded (``total_cost``).
- Stored figures (the six-place columns: GPU-hours, costs, busy fractions, estimates and holds) are
  rounded once, to ``STORED_QUANTUM``, half up (``stored``). Estimates and budget holds are the one
  exception, and it is deliberate: they round up (``stored(…, up=True)``), so that a hold is never
  below the charge it stands for.
- What people read (pages, the CSV, invoices, messages; the API through
  portal.fields.DecimalStringField) is rounded once more, from the exact or stored figure, to
  cents, half up (``display``). Nothing is computed from a displayed figure, and values are compared
  before they are rounded for display.

Pure functions, no Django: the core (portal/) owns it, so accounting and jobs both import it."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal

HOUR = Decimal(3600)  # seconds in an hour: GPU-seconds / HOUR = GPU-hours (a Decimal: int / HOUR stays exact-decimal)
STORED_PLACES = 6  # the decimal_places of every stored GPU-hours, cost and fraction column
STORED_QUANTUM = Decimal(1).scaleb(-STORED_PLACES)  # 0.000001
DISPLAY_PLACES = 2  # cents; hundredths of a GPU-hour
ROUNDING = ROUND_HALF_UP  # the one rounding rule, for stored figures and for display


def gpu_hours(gpu_seconds: int | Decimal) -> Decimal:
    """GPU-seconds as GPU-hours, not rounded (round with ``stored`` or ``display``)."""
    return Decimal(gpu_seconds) / HOUR


def cost(*, price: Decimal, gpu_seconds: int | Decimal | None = None, gpu_hours: Decimal | None = None) -> Decimal:
    """The cost of GPU-seconds (or of GPU-hours) at ``price`` per GPU-hour, not rounded. From GPU-seconds
    it multiplies first and divides once: 1 GPU-second at 8/GPU-h is 8/3600, not 8 × round(1/3600)."""
    if (gpu_seconds is None) == (gpu_hours is None):
        raise TypeError("cost() takes gpu_seconds or gpu_hours, one of them")
    if gpu_seconds is not None:
        return Decimal(gpu_seconds) * Decimal(price) / HOUR
    return Decimal(gpu_hours) * Decimal(price)


def total_cost(pieces: Iterable[tuple[int | Decimal, Decimal]]) -> Decimal:
    """The cost of several (GPU-seconds, price) pieces: the exact GPU-second × price products added,
    divided once — not a sum of rounded costs. Not rounded."""
    return sum((Decimal(seconds) * Decimal(price) for seconds, price in pieces), Decimal(0)) / HOUR


def gpu_seconds(hours: Decimal) -> int:
    """GPU-hours (a stored six-place figure) back to whole GPU-seconds, half up."""
    return int((Decimal(hours) * HOUR).to_integral_value(ROUNDING))


def stored(value: int | Decimal, *, up: bool = False) -> Decimal:
    """``value`` as stored: six places, half up; ``up``: rounded up (estimates and budget holds, never
    below the charge)."""
    return Decimal(value).quantize(STORED_QUANTUM, ROUND_CEILING if up else ROUNDING)


def display(value: int | Decimal, places: int = DISPLAY_PLACES) -> Decimal:
    """``value`` as people read it: two places (cents, hundredths of a GPU-hour) by default, half up.
    Round here once, from the exact or stored figure; never compute or compare with the result."""
    return Decimal(value).quantize(Decimal(1).scaleb(-places), ROUNDING)
