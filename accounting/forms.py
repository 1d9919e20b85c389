"""Forms of the accounting pages: the report date range and the admins' rate form."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from django import forms
from django.utils import timezone

from accounting.models import QUOTA_MAX_GPUS
from accounting.selectors import GROUP_BY_CHOICES, billing_date, month_start

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


class CostReportForm(DateRangeForm):
    group_by = forms.ChoiceField(choices=[(c, c) for c in GROUP_BY_CHOICES], required=False)
    cluster = forms.CharField(max_length=64, required=False, help_text="Empty: every cluster.")

    def clean(self):
        data = super().clean()
        data["group_by"] = data.get("group_by") or "team"
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
