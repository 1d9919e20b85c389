"""How bookings are charged: the one reader of settings.BOOKING_CHARGE_MODE.

"reserved" (the default): an approved booking is charged for every GPU-hour it holds, and usage
inside it is free (its slices cost 0, budgets do not count it twice). "used": bookings cost nothing
and only usage is charged. portal/project/settings.py validates the value (env.choice)."""

from __future__ import annotations

from django.conf import settings

RESERVED = "reserved"
USED = "used"


def booking_charge_mode() -> str:
    """"reserved" or "used" (settings.BOOKING_CHARGE_MODE)."""
    return settings.BOOKING_CHARGE_MODE


def bookings_charge_reserved() -> bool:
    """True when bookings charge their reserved hours (usage inside them is then free)."""
    return booking_charge_mode() == RESERVED
