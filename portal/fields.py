"""Serializer fields shared by the API's input serializers."""

from __future__ import annotations

from rest_framework import serializers


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
