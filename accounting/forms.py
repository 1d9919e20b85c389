"""Forms of the accounting pages: the report ranges and the admins' rate form. The cost report's
range (``report_range``: a day or an ISO datetime per bound) is owned here and shared by the report
page's form and the API's query serializer (accounting.apis)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal
from urllib.parse import urlencode

from django import forms
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from accounting.models import QUOTA_MAX_GPUS
from accounting.selectors import GROUP_BY_CHOICES, billing_date, billing_midnight, billing_zone, month_start

MAX_RANGE_DAYS = 3 * 366


def default_range() -> tuple[dt.date, dt.date]:
    """The current month so far (billing time zone)."""
    today = billing_date(timezone.now())
    return month_start(today), today


def validate_range(start: dt.date | None, end: dt.date | None) -> dict[str, str]:
    """Field errors of a report range (shared by the form and the API serializer)."""
    if start and end and end < start:
        return {"end": "The end date must not be before the start date."}
    if start and end and (end - start).days > MAX_RANGE_DAYS:
        return {"end": f"Choose a range of at most {MAX_RANGE_DAYS} days."}
    return {}


class DateRangeForm(forms.Form):
    start = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}), help_text="Inclusive.")

    def __init__(self, *args, default: tuple[dt.date, dt.date] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.default = default or default_range()

    def clean(self):
        data = super().clean()
        data["start"] = data.get("start") or self.default[0]
        data["end"] = data.get("end") or self.default[1]
        for field, message in validate_range(data["start"], data["end"]).items():
            self.add_error(field, message)
        return data


DAY_OR_DATETIME_INVALID = "Give a day (YYYY-MM-DD) or an ISO 8601 date and time (YYYY-MM-DDTHH:MM)."


def day_or_datetime(text: str) -> dt.date | dt.datetime:
    """One bound of the cost report as asked: a day (``2026-12-05``) or an ISO 8601 date and time
    (``2026-12-05T12:00``, ``…T12:00:00Z``, ``…T12:00+08:00``; without an offset: the billing time
    zone, settings.TIME_ZONE, as days are). ValueError (DAY_OR_DATETIME_INVALID) for anything else."""
    text = text.strip() if isinstance(text, str) else ""
    try:
        if "T" in text or " " in text or ":" in text:
            value = parse_datetime(text)
            if value is not None and timezone.is_naive(value):
                value = timezone.make_aware(value, billing_zone())
        else:
            value = parse_date(text)
    except ValueError:  # well formed but impossible (2026-02-30)
        value = None
    if value is None:
        raise ValueError(DAY_OR_DATETIME_INVALID)
    return value


def _bound_text(value: dt.date | dt.datetime) -> str:
    """A bound as a user types it: a day as YYYY-MM-DD, a date and time in the billing time zone
    (YYYY-MM-DDTHH:MM, seconds when it has some; the offset only for the repeated hour of a DST change)."""
    if not isinstance(value, dt.datetime):
        return value.isoformat()
    local = value.astimezone(billing_zone())
    if local.fold:
        return local.isoformat()
    local = local.replace(tzinfo=None)
    return local.isoformat(timespec="minutes" if not (local.second or local.microsecond) else "auto")


@dataclass(frozen=True)
class ReportRange:
    """The cost report's range: the bounds as asked (a day or a datetime each) and the instants
    [start_at, end_at) they mean — a day starts at its 00:00 and, as ``end``, is inclusive (billing
    time zone); a datetime is that instant (``end`` exclusive)."""

    start: dt.date | dt.datetime
    end: dt.date | dt.datetime
    start_at: dt.datetime
    end_at: dt.datetime

    @property
    def whole_days(self) -> bool:
        return not isinstance(self.start, dt.datetime) and not isinstance(self.end, dt.datetime)

    @property
    def start_text(self) -> str:
        return _bound_text(self.start)

    @property
    def end_text(self) -> str:
        return _bound_text(self.end)

    @property
    def span_text(self) -> str:
        """[start_at, end_at) as dates and times of the billing time zone."""
        return f"{_bound_text(self.start_at)} – {_bound_text(self.end_at)}"

    def query(self, **extra: str) -> str:
        """The range (and ``extra``) as a query string: the page's CSV links carry the range asked."""
        return urlencode({"start": self.start_text, "end": self.end_text, **extra})

    def csv_filename(self, group_by: str) -> str:
        span = "-".join(value.isoformat().replace(":", "").replace("+", "p") for value in (self.start, self.end))
        return f"cost-{group_by}-{span}.csv"


def report_range(start: dt.date | dt.datetime | None, end: dt.date | dt.datetime | None) -> tuple[ReportRange | None, dict[str, str]]:
    """The cost report's range from its bounds (parsed by ``day_or_datetime``; None: this month so
    far) and its field errors: an end not after the start, or a range longer than MAX_RANGE_DAYS.
    The one rule of the report page's form and the API's query serializer."""
    default = default_range()
    start = start or default[0]
    end = end or default[1]
    start_at = start if isinstance(start, dt.datetime) else billing_midnight(start)
    end_at = end if isinstance(end, dt.datetime) else billing_midnight(end + dt.timedelta(days=1))
    if end_at <= start_at:
        return None, {"end": "The end must be after the start."}
    if end_at - start_at > dt.timedelta(days=MAX_RANGE_DAYS + 1):
        return None, {"end": f"Choose a range of at most {MAX_RANGE_DAYS} days."}
    return ReportRange(start=start, end=end, start_at=start_at, end_at=end_at), {}


class DayOrDateTimeFormField(forms.Field):
    """A bound of the cost report (``day_or_datetime``): a day or an ISO 8601 date and time."""

    widget = forms.TextInput(attrs={"placeholder": "YYYY-MM-DD or YYYY-MM-DDTHH:MM", "size": 20})

    def to_python(self, value):
        if value in self.empty_values:
            return None
        try:
            return day_or_datetime(value)
        except ValueError as exc:
            raise forms.ValidationError(str(exc), code="invalid") from None


class CostReportForm(forms.Form):
    """The report page's query: ``cleaned_data["range"]`` is a ReportRange (report_range, as the API)."""

    start = DayOrDateTimeFormField(required=False, help_text="A day, or a date and time. Empty: the 1st of this month.")
    end = DayOrDateTimeFormField(required=False, help_text="A day (inclusive), or a date and time (exclusive). Empty: today.")
    group_by = forms.ChoiceField(choices=[(c, c) for c in GROUP_BY_CHOICES], required=False)
    cluster = forms.CharField(max_length=64, required=False, help_text="Empty: every cluster.")

    def clean(self):
        data = super().clean()
        data["group_by"] = data.get("group_by") or "team"
        if "start" in data and "end" in data:  # both parsed (else their field errors say why)
            data["range"], errors = report_range(data["start"], data["end"])
            for field, message in errors.items():
                self.add_error(field, message)
        return data


class RateForm(forms.Form):
    gpu_type = forms.CharField(max_length=32, help_text="Slurm GRES type, e.g. a100.")
    partition = forms.CharField(max_length=64, required=False, help_text="Empty: every partition.")
    price_per_gpu_hour = forms.DecimalField(max_digits=12, decimal_places=4, min_value=Decimal("0"))
    effective_from = forms.DateField(widget=forms.DateInput(attrs={"type": "date"}))
    note = forms.CharField(max_length=200, required=False)


class BookingForm(forms.Form):
    """Book GPUs for a team (its managers; admins for any team). Times in the viewer's time zone.
    ``clusters``: the configured clusters' names; the cluster picker is shown only when there are
    several (as the job form's), else it is hidden and always empty (the default cluster)."""

    team = forms.ModelChoiceField(queryset=None, to_field_name="slug", empty_label=None)
    cluster = forms.ChoiceField(choices=(), required=False,
                                help_text="Needed only when several clusters have the GPU type.")  # fmt: skip
    gpu_type = forms.ChoiceField(choices=(), label="GPU type")
    gpus = forms.IntegerField(min_value=1, label="GPUs")
    start = forms.DateTimeField(widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"))
    end = forms.DateTimeField(widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"))
    note = forms.CharField(max_length=200, required=False)

    def __init__(self, *args, teams, gpu_types: list[str], gpus_per_node: int | None = None,
                 clusters: tuple[str, ...] = (), whole_nodes_on: tuple[str, ...] = (),
                 types_on: dict[str, list[str]] | None = None, **kwargs):  # fmt: skip
        """``gpus_per_node``: the unit of whole-node bookings; ``whole_nodes_on``: the clusters where
        it applies when only some of several clusters reserve whole nodes (empty: every cluster);
        ``types_on``: each cluster's GPU types, named beside it in the picker."""
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = teams
        self.fields["gpu_type"].choices = [(t, t) for t in gpu_types]
        if len(clusters) > 1:
            types_on = types_on or {}
            self.fields["cluster"].choices = [("", "the GPU type's (when only one cluster has it)")] + [
                (name, f"{name} ({', '.join(types_on[name])})" if types_on.get(name) else name) for name in clusters
            ]  # fmt: skip
            self.fields["cluster"].help_text = "Where the GPUs are booked; each cluster lists its GPU types."
        else:  # one cluster: nothing to choose (hidden, always empty)
            self.fields["cluster"].choices = [("", "")]
            self.fields["cluster"].widget = forms.HiddenInput()
        if gpus_per_node and whole_nodes_on:
            self.fields["gpus"].help_text = (
                f"A multiple of {gpus_per_node} on {', '.join(whole_nodes_on)}: Slurm there reserves whole nodes."
            )
        elif gpus_per_node:
            self.fields["gpus"].help_text = f"A multiple of {gpus_per_node}: Slurm here reserves whole nodes."
            self.fields["gpus"].widget.attrs["step"] = gpus_per_node
            self.fields["gpus"].initial = gpus_per_node


class BookingDecisionForm(forms.Form):
    note = forms.CharField(max_length=500, required=False)


class QuotaRequestForm(forms.Form):
    """A manager asks for a GPU-hour budget for one of their teams (admins: any team)."""

    team = forms.ModelChoiceField(queryset=None, to_field_name="slug", empty_label=None)
    gpu_type = forms.ChoiceField(choices=(), required=False, label="GPU type")
    gpu_hours = forms.DecimalField(max_digits=12, decimal_places=2, min_value=Decimal("0"), label="GPU-hours")
    max_gpus = forms.IntegerField(min_value=0, max_value=QUOTA_MAX_GPUS, required=False, label="Max GPUs at once",
                                  help_text="Empty: no cap.")  # fmt: skip
    period_start = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}),
                                   help_text="Empty: the 1st of this month.")  # fmt: skip
    period_end = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}),
                                 help_text="Exclusive. Empty: the 1st of the next month.")  # fmt: skip
    justification = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=5000)

    def __init__(self, *args, teams, gpu_types: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = teams
        self.fields["gpu_type"].choices = [("", "Any type")] + [(t, t) for t in gpu_types]


class QuotaDecisionForm(forms.Form):
    comment = forms.CharField(max_length=1000, required=False)
