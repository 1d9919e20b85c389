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
