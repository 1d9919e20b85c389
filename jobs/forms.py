"""Forms of the job pages. They check the shape of the input only; every business rule (team
membership, partition limits, GPU types, budget) is ``job_submit``'s / ``job_template_create``'s,
whose ApplicationError is placed beside the fields by ``form_add_application_error``."""

from __future__ import annotations

import re
import uuid

from django import forms
from django.utils import timezone
from gpuportal_cli.sbatch import parse_time_minutes

from accounting.selectors import bookings_usable_by
from jobs.choices import TemplateScope
from jobs.script_fields import overrides_only, uploaded_script_text
from portal.roles import is_admin
from portal.selectors import teams_user_can_submit_to
from portal.slurm import configured_clusters

ENV_HELP = "One NAME=value per line."


class TimeLimitField(forms.CharField):
    """A time limit typed as Slurm does (``90``, ``1:30:00``, ``2-00:00:00``) or as ``2h`` / ``90m``;
    cleaned to whole minutes (None when empty)."""

    def to_python(self, value):
        value = super().to_python(value)
        if value in self.empty_values:
            return None
        try:
            return parse_time_minutes(value)
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


class JobForm(forms.Form):
    """The submission form. Partition and GPU type choices come from the synced inventory
    (``cluster_summary()``), teams from ``teams_user_can_submit_to``."""

    team = forms.ModelChoiceField(queryset=None, to_field_name="slug", empty_label=None)
    # Every field below may stay empty: the script's #SBATCH lines decide; a value overrides them
    # ("Read script" fills them from the script; a value equal to the script's is no override).
    name = forms.CharField(max_length=128, required=False, help_text="Letters, digits, '.', '_' or '-'. Empty: the script's --job-name.")
    partition = forms.ChoiceField(choices=(), required=False)
    # shown only when the portal serves several clusters: where a partition name on several of them runs
    cluster = forms.ChoiceField(choices=(), required=False, help_text="Needed only when the partition's name is on several clusters.")
    gpu_type = forms.ChoiceField(choices=(), required=False, label="GPU type")
    gpus = forms.IntegerField(min_value=1, required=False, label="GPUs", help_text="For the whole job. Empty: the script's GPU directive.")
    nodes = forms.IntegerField(min_value=1, required=False, help_text="Empty: the script's --nodes (else 1).")
    ntasks = forms.IntegerField(min_value=1, required=False, label="Tasks", help_text="Empty: the script's --ntasks (else one per node).")
    cpus_per_task = forms.IntegerField(min_value=1, required=False, label="CPUs per task", help_text="Empty: the script's --cpus-per-task.")
    cpus_per_gpu = forms.IntegerField(min_value=1, required=False, label="CPUs per GPU", help_text="Empty: the script's --cpus-per-gpu.")
    memory_gb = forms.IntegerField(min_value=1, required=False, label="Memory per node (GB)", help_text="Empty: the partition's default.")
    time_limit_minutes = TimeLimitField(
        required=False,
        label="Time limit",
        help_text="Minutes, or 1:30:00, 2-00:00:00, 2h, 90m. Empty: the partition's default.",
    )
    array = forms.CharField(max_length=1024, required=False, label="Array", help_text="Task indexes, e.g. 0-9 or 1-100%10. Empty: the script's --array (else no array).")
    script_file = forms.FileField(required=False, label="Script file", help_text="A .sbatch or .sh file: it replaces the script below.")
    script = forms.CharField(widget=forms.Textarea(attrs={"rows": 14, "spellcheck": "false"}), strip=False, required=False)
    workdir = forms.CharField(max_length=1024, required=False, label="Working directory", help_text="Absolute path; empty: the site default.")
    environment = EnvironmentField(required=False, help_text=ENV_HELP)
    idempotency_key = forms.CharField(widget=forms.HiddenInput, required=False, max_length=255)
    booking = forms.ChoiceField(
        choices=(), required=False, label="Run in booking",
        help_text="A booking of the team (approved, not ended): the job runs in its Slurm reservation. "
        "Use the booking's GPU type and end before the booking does.",
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

    def clean_idempotency_key(self):
        return self.cleaned_data.get("idempotency_key") or None

    def job_kwargs(self, *, as_filled: bool = False) -> dict:
        """Keyword arguments for job_submit: the fields that override the script (one equal to the
        script's directive does not: jobs.script_fields). ``as_filled``: every field as shown (a
        template keeps them as its spec)."""
        data = self.cleaned_data if as_filled else overrides_only(self.cleaned_data, self.cleaned_data["script"])
        return {
            "name": data.get("name") or None,
            "script": data["script"],
            "partition": data.get("partition") or "",
            "gpu_type": data.get("gpu_type") or "",
            "gpus": data.get("gpus"),
            "nodes": data.get("nodes"),
            "ntasks": data.get("ntasks"),
            "cpus_per_task": data.get("cpus_per_task"),
            "cpus_per_gpu": data.get("cpus_per_gpu"),
            "memory_gb": data.get("memory_gb"),
            "time_limit_minutes": data.get("time_limit_minutes"),
            "array": data.get("array") or None,
            "workdir": data.get("workdir") or None,
            "environment": data.get("environment") or {},
            # a submission's only (a template's spec has no cluster)
            **({"cluster": self.cleaned_data["cluster"]} if not as_filled and self.cleaned_data.get("cluster") else {}),
        }


def initial_from_spec(spec, *, team_slug: str | None = None) -> dict:
    """Form initial values from a Job or a JobTemplate (the "submit from template" / "resubmit" path)."""
    initial = {
        "name": re.sub(r"[^A-Za-z0-9._-]+", "-", spec.name).strip("-")[:128],
        "script": spec.script,
        "gpu_type": spec.gpu_type,
        "gpus": spec.gpus,
        "nodes": spec.nodes,
        "cpus_per_gpu": spec.cpus_per_gpu,
        "memory_gb": spec.memory_gb,
        "time_limit_minutes": format_minutes(spec.time_limit_minutes),
        "workdir": spec.workdir,
        "environment": spec.environment or {},
    }
    if spec.partition:
        initial["partition"] = spec.partition
    if team_slug:
        initial["team"] = team_slug
    return initial


class QuoteForm(forms.Form):
    """The fields the live estimate needs; lenient (a half-typed form yields no quote, not errors)."""

    partition = forms.CharField(required=False)
    gpu_type = forms.CharField(required=False)
    gpus = forms.IntegerField(min_value=1, required=False)
    nodes = forms.IntegerField(min_value=1, required=False)
    ntasks = forms.IntegerField(min_value=1, required=False)
    cpus_per_task = forms.IntegerField(min_value=1, required=False)
    cpus_per_gpu = forms.IntegerField(min_value=1, required=False)
    memory_gb = forms.IntegerField(min_value=1, required=False)
    time_limit_minutes = TimeLimitField(required=False)
    array = forms.CharField(required=False)
    script = forms.CharField(required=False, strip=False)


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
