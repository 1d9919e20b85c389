"""The job list's filters, shared by the API (``GET /api/v1/jobs/``) and the HTML list page."""

from __future__ import annotations

import datetime as dt

import django_filters
from django.core.exceptions import ValidationError
from django_filters.fields import IsoDateTimeField

from jobs.choices import LIVE_STATES, TERMINAL_STATES, JobState
from jobs.models import Job

# Columns a client may sort by (never an unvalidated order_by from the query string).
JOB_ORDERING_FIELDS = (
    ("created_at", "created_at"),
    ("submitted_at", "submitted_at"),
    ("started_at", "started_at"),
    ("ended_at", "ended_at"),
    ("name", "name"),
    ("state", "state"),
    ("gpus", "gpus"),
)


class UtcIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 date-time taken to UTC: PostgreSQL refuses offsets past ±15:59 that Python takes
    (``+19:44`` was a 500), and a date at the edge of the calendar may not exist in UTC (400)."""

    def to_python(self, value):
        value = super().to_python(value)
        if value is None or value.utcoffset() is None:
            return value
        try:
            return value.astimezone(dt.timezone.utc)
        except OverflowError:
            raise ValidationError("Out of the range of dates.", code="invalid") from None


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcIsoDateTimeField


class JobFilter(django_filters.FilterSet):
    """team (slug), state (one or more, or the groups "live" / "ended"), since (created at or after),
    mine (only my jobs), ordering (whitelisted columns, "-" for descending)."""

    team = django_filters.CharFilter(field_name="team__slug", label="Team (slug)")
    state = django_filters.MultipleChoiceFilter(
        choices=JobState.choices + [("live", "Live (not ended)"), ("ended", "Ended")],
        method="filter_state",
        label="State",
    )
    since = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="gte", label="Created at or after")
    # "true" / "false" (the page's checkbox sends "true"); anything else answers 400, as the schema says
    mine = django_filters.ChoiceFilter(choices=[("true", "true"), ("false", "false")], method="filter_mine", label="Only my jobs")
    ordering = django_filters.OrderingFilter(fields=JOB_ORDERING_FIELDS)

    class Meta:
        model = Job
        fields = ["team", "state", "since", "mine"]

    def filter_state(self, queryset, name, values):
        if not values:
            return queryset
        states: set[str] = set()
        for value in values:
            states |= set(LIVE_STATES) if value == "live" else set(TERMINAL_STATES) if value == "ended" else {value}
        return queryset.filter(state__in=sorted(states))

    def filter_mine(self, queryset, name, value):
        if value == "true" and self.request is not None and self.request.user.is_authenticated:
            return queryset.filter(submitter=self.request.user)
        return queryset


def list_ordering(value: str | None) -> tuple[str, bool]:
    """The job list's order from its ``ordering`` parameter (JobFilter has refused anything else):
    (column, descending), by the first column named; newest first by default. The keyset pages
    (jobs.paging) walk this column, then the primary key."""
    term = (value or "").split(",")[0].strip()
    name = term.lstrip("-")
    columns = {param: column for column, param in JOB_ORDERING_FIELDS}
    if name not in columns:
        return "created_at", True
    return columns[name], term.startswith("-")
