"""Forms of the job pages. They check the shape of the input only; every business rule (team
membership, partition limits, GPU types, budget) is ``job_submit``'s / ``job_template_create``'s,
whose ApplicationError is placed beside the fields by ``form_add_application_error``."""

from __future__ import annotations

import functools
import re
import uuid

from django import forms
from django.utils import timezone
from gpuportal_sbatch.directives import parse_time_limit_minutes

from accounting.selectors import bookings_usable_by
from jobs.choices import TemplateScope
from jobs.job_fields import FIELDS, FORM_FIELDS, JOB_FIELDS, TEMPLATE_FIELDS, JobField, given_or_empty
from jobs.script_fields import overrides_only, uploaded_script_text
from jobs.spec import ParsedScript, parse_script
from portal.roles import is_admin
from portal.selectors import teams_user_can_submit_to
from portal.slurm import configured_clusters

class TimeLimitField(forms.CharField):
    """A time limit typed as Slurm does (``90``, ``1:30:00``, ``2-00:00:00``) or as ``2h`` / ``90m``;
    cleaned to whole minutes (None when empty)."""

    def to_python(self, value):
        value = super().to_python(value)
        if value in self.empty_values:
            return None
        try:
            return parse_time_limit_minutes(value)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)[:1].upper() + str(exc)[1:] + ".") from None


class EnvironmentField(forms.CharField):
    """``NAME=value`` lines → a dict (names are checked by the service)."""

    widget = forms.Textarea(attrs={"rows": 3})

    def to_python(self, value):
        value = super().to_python(value)
        environment: dict[str, str] = {}
        for number, line in enumerate((value or "").splitlines(), start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            key, eq, val = line.partition("=")
            if not eq or not key.strip():
                raise forms.ValidationError(f"Line {number}: expected NAME=value.")
            environment[key.strip()] = val
        return environment

    def prepare_value(self, value):
        if isinstance(value, dict):
            return "\n".join(f"{k}={v}" for k, v in value.items())
        return value


class JobIdsField(forms.CharField):
    """Portal job ids separated by commas or spaces → a list of UUIDs, in order, each once (the
    service checks that each names a job the user may see)."""

    def to_python(self, value):
        value = super().to_python(value)
        ids: list[uuid.UUID] = []
        for word in re.split(r"[\s,]+", value or ""):
            if not word:
                continue
            try:
                job_id = uuid.UUID(word)
            except ValueError:
                raise forms.ValidationError(f"{word!r} is not a job id.") from None
            if job_id not in ids:
                ids.append(job_id)
        return ids

    def prepare_value(self, value):
        if isinstance(value, (list, tuple)):
            return ", ".join(str(v) for v in value)
        return value


def format_minutes(minutes: int | None) -> str:
    """Minutes as the form shows them back: ``90`` → ``1:30:00``, ``2880`` → ``2-00:00:00``."""
    if not minutes:
        return ""
    days, rest = divmod(int(minutes), 1440)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours}:{mins:02d}:00"


def _booking_choices(user) -> list[tuple[str, str]]:
    """The user's teams' usable bookings (accounting.selectors.bookings_usable_by)."""
    def local(value):
        return timezone.localtime(value).strftime("%Y-%m-%d %H:%M")

    return [
        (str(b.pk), f"{b.team.slug}: {b.gpus} × {b.gpu_type}, {local(b.start)} – {local(b.end)} ({b.reservation_name})")
        for b in bookings_usable_by(user)
    ]


def _form_field(field: JobField, *, lenient: bool = False) -> forms.Field:
    """The form field of a job field (jobs.job_fields): optional (empty: the script decides).
    ``lenient``: the live estimate's (choices are not checked, no labels)."""
    shown = {} if lenient else {"label": field.label or None, "help_text": field.help}
    if field.kind == "int":
        return forms.IntegerField(min_value=1, required=False, **shown)
    if field.kind == "time":
        return TimeLimitField(required=False, **shown)
    if field.kind == "dict":
        return EnvironmentField(required=False, **shown)
    if field.kind == "ids":
        return JobIdsField(required=False, **shown)
    if field.kind == "script":
        return forms.CharField(required=False, strip=False)
    if field.kind == "choice" and not lenient:
        return forms.ChoiceField(choices=(), required=False, **shown)
    return forms.CharField(max_length=None if lenient else field.max_length, required=False, **shown)


def _job_fields_form(class_name: str, names, **kwargs) -> type[forms.Form]:
    """A form class of the job fields ``names`` (jobs.job_fields), in their declared order."""
    return type(class_name, (forms.Form,), {name: _form_field(FIELDS[name], **kwargs) for name in names})


class JobForm(_job_fields_form("JobFieldsForm", FORM_FIELDS)):
    """The submission form. Partition and GPU type choices come from the synced inventory
    (``cluster_summary()``), teams from ``teams_user_can_submit_to``; the job's fields are
    jobs.job_fields' (FORM_FIELDS). Every one of them may stay empty: the script's #SBATCH lines
    decide; a value overrides them ("Read script" fills them from the script; a value equal to the
    script's is no override)."""

    field_order = ["team"]  # then the job fields, then those below
    team = forms.ModelChoiceField(queryset=None, to_field_name="slug", empty_label=None)
    script_file = forms.FileField(required=False, label="Script file", help_text="A .sbatch or .sh file: it replaces the script below.")
    script = forms.CharField(widget=forms.Textarea(attrs={"rows": 14, "spellcheck": "false"}), strip=False, required=False)
    idempotency_key = forms.CharField(widget=forms.HiddenInput, required=False, max_length=255)
    booking = forms.ChoiceField(
        choices=(), required=False, label="Run in booking",
        help_text="A booking of the team (approved, not ended): the job runs in its Slurm reservation. "
        "Use the booking's GPU type and end before the booking does.",
    )  # fmt: skip
    idle_exempt = forms.BooleanField(
        required=False, label="Exempt from the idle-GPU policy",
        help_text="For a debugger or interactive session whose GPUs may idle: the team's idle-GPU policy never "
        "cancels it. The team's managers see the exemption.",
    )  # fmt: skip

    def __init__(self, *args, user, summary: dict, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        self.summary = summary
        self.fields["team"].queryset = teams_user_can_submit_to(user).order_by("name")
        partitions = summary["partitions"]
        choices, seen = [("", "the script's --partition (else the default)")], set()
        for p in partitions:  # a name on several clusters once (the cluster field then says which)
            if p["name"] in seen:
                continue
            seen.add(p["name"])
            on = sorted(q["cluster"] for q in partitions if q["name"] == p["name"] and q["cluster"])
            where = f" on {', '.join(on)}" if on else ""
            choices.append((p["name"], f"{p['name']}{' (default)' if p['is_default'] else ''}{where} — {', '.join(p['gpu_types']) or 'no GPUs'}"))
        self.fields["partition"].choices = choices
        self.fields["partition"].initial = ""
        clusters = [config.name for config in configured_clusters()]
        if len(clusters) > 1:
            self.fields["cluster"].choices = [("", "the partition's")] + [(name, name) for name in clusters]
        else:  # one cluster: nothing to choose (hidden, always empty)
            self.fields["cluster"].choices = [("", "")]
            self.fields["cluster"].widget = forms.HiddenInput()
        types = sorted({t for p in partitions for t in p["gpu_types"]})
        self.fields["gpu_type"].choices = [("", "any type")] + [(t, t) for t in types]
        self.fields["booking"].choices = [("", "none (shared queue)")] + _booking_choices(user)
        if not self.is_bound and not self.initial.get("idempotency_key"):
            self.initial["idempotency_key"] = uuid.uuid4().hex

    def clean_script_file(self):
        upload = self.cleaned_data.get("script_file")
        return uploaded_script_text(upload) if upload else None

    def clean_script(self):
        script = self.cleaned_data.get("script_file") or self.cleaned_data.get("script") or ""
        if not script.strip():
            raise forms.ValidationError("This field is required.")
        return script

    def job_field_rows(self) -> list:
        """The job fields as the page shows them (jobs/job_form.html), in their declared order; the
        booking after the GPU type when the user has one to choose."""
        rows = []
        for name in FORM_FIELDS:
            rows.append(self[name])
            if name == "gpu_type" and len(self.fields["booking"].choices) > 1:
                rows.append(self["booking"])
        return rows

    @functools.cached_property
    def parsed(self) -> ParsedScript:
        """The cleaned script's directives, read once for everything this request does with them."""
        return parse_script(self.cleaned_data.get("script") or "")

    def clean_idempotency_key(self):
        return self.cleaned_data.get("idempotency_key") or None

    def job_kwargs(self, *, as_filled: bool = False) -> dict:
        """Keyword arguments for job_submit: the script and the fields that override it (one equal to
        the script's directive does not: jobs.script_fields; an empty one is the field's empty value).
        ``as_filled``: every field as shown (a template keeps them as its spec); else with the script's
        parse (``parsed``), so job_submit does not read it again."""
        if as_filled:
            return {"script": self.cleaned_data["script"], **given_or_empty(FORM_FIELDS, self.cleaned_data)}
        data = overrides_only(self.cleaned_data, self.parsed)
        return {"script": data["script"], **given_or_empty(FORM_FIELDS, data), "parsed": self.parsed}


def initial_from_spec(spec, *, team_slug: str | None = None) -> dict:
    """Form initial values from a Job or a JobTemplate (the "submit from template" / "resubmit" path):
    the fields a template keeps (jobs.job_fields.TEMPLATE_FIELDS), and the job's name."""
    initial = {name: getattr(spec, name) for name in TEMPLATE_FIELDS}
    initial.update(
        name=re.sub(r"[^A-Za-z0-9._-]+", "-", spec.name).strip("-")[:128],
        time_limit_minutes=format_minutes(spec.time_limit_minutes), environment=spec.environment or {},
    )
    if team_slug:
        initial["team"] = team_slug
    return initial


# The fields the live estimate needs (the job fields that size it and that the page shows); lenient
# (a half-typed form yields no quote, not errors).
QuoteForm = _job_fields_form("QuoteForm", [f.name for f in JOB_FIELDS if f.sizes and (f.form or f.kind == "script")], lenient=True)


class TemplateSaveForm(forms.Form):
    """Name and scope of a template saved from a job or from the submission form."""

    template_name = forms.CharField(max_length=128, label="Template name")
    template_scope = forms.ChoiceField(label="Visible to", choices=())
    template_description = forms.CharField(required=False, label="Description", widget=forms.Textarea(attrs={"rows": 2}))

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        choices = [(TemplateScope.PERSONAL, "Only me"), (TemplateScope.TEAM, "The job's team")]
        if is_admin(user):
            choices.append((TemplateScope.SITE, "Everyone (site template)"))
        self.fields["template_scope"].choices = choices
        self.fields["template_scope"].initial = TemplateScope.PERSONAL
