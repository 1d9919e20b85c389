"""Serializer fields shared by the API's serializers."""

from __future__ import annotations

from rest_framework import serializers

from portal import money


class DecimalStringField(serializers.DecimalField):
    """Every money and GPU-hours figure the API answers: a decimal string (``"12.35"``), rounded once,
    here, half up to ``decimal_places`` (two: cents, hundredths of a GPU-hour) from the exact value
    the selector hands over; declared in the OpenAPI schema as ``type: string, format: decimal`` with
    a pattern (drf-spectacular's reading of a DecimalField that coerces to string).

    Why a string and not a JSON number: money and GPU-hours are exact decimals, and a JSON number is
    read as a binary float by most clients (JavaScript, generated clients); DRF's own default for
    decimals (COERCE_DECIMAL_TO_STRING) is the string. ``coerce_to_string`` is fixed here, not left to
    that setting, so that the schema and the answers cannot disagree. For answers only: an input
    field with ``rounding`` would round a request's extra places instead of refusing them."""

    def __init__(self, *, max_digits: int = 18, decimal_places: int = money.DISPLAY_PLACES, **kwargs):
        kwargs.setdefault("rounding", money.ROUNDING)  # portal.money's display rounding
        super().__init__(max_digits=max_digits, decimal_places=decimal_places, coerce_to_string=True, **kwargs)


class StrictCharField(serializers.CharField):
    """A JSON string, as the schema says (``type: string``): DRF's CharField also takes a number and
    turns it into text (``{"note": 0}`` → ``"0"``), which the contract does not promise."""

    default_error_messages = {"invalid": "Not a valid string."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


def whole_number(text: str) -> int | None:
    """A whole number written in ASCII digits (a query parameter, a form field), or None. Not
    ``str.isdigit()``: it takes "²" and "①", which ``int()`` refuses (a 500 instead of a 400)."""
    return int(text) if text and text.isascii() and text.isdigit() else None
