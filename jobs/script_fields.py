"""The submission form read from a script: an uploaded file's text, the form fields its ``#SBATCH``
directives fill, and which filled fields are overrides at submit.

The rule: a field whose value is what the script's own directive says is *not* an override (the
script decides, as if the field were empty), so submitting a form filled from a script gives Slurm
exactly what the script alone does; a field the user changed is an override, as on sbatch's command
line. The GPU count is the job's total, so when the node count is an override the GPU count the form
shows is kept as an override too (the script's per-node count × the new nodes would be a different
total from the one on the screen)."""

from __future__ import annotations

from django import forms
from gpuportal_sbatch.directives import DirectiveError, memory_gb_exact, script_request

from jobs.job_fields import SCRIPT_FIELDS  # the form fields a script fills (its directive's value, else empty)
from jobs.spec import MAX_SCRIPT_BYTES, ParsedScript

SCRIPT_UPLOAD_SUFFIXES = (".sbatch", ".sh", ".slurm", ".bash", ".job", ".txt")


def uploaded_script_text(upload) -> str:
    """An uploaded batch script's text; ValidationError for a file too large, not UTF-8 text, or empty."""
    if upload.size > MAX_SCRIPT_BYTES:
        raise forms.ValidationError(f"The file is larger than {MAX_SCRIPT_BYTES // 1024} KiB; a batch script is text.")
    name = (upload.name or "").lower()
    if "." in name and not name.endswith(SCRIPT_UPLOAD_SUFFIXES):
        raise forms.ValidationError(f"Upload a batch script ({', '.join(SCRIPT_UPLOAD_SUFFIXES)}).")
    raw = upload.read(MAX_SCRIPT_BYTES + 1)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise forms.ValidationError("The file is not UTF-8 text; upload the batch script itself.") from None
    if "\x00" in text:
        raise forms.ValidationError("The file is binary, not a batch script.")
    if not text.strip():
        raise forms.ValidationError("The file is empty.")
    return text.replace("\r\n", "\n")


def fields_from_script(parsed: ParsedScript) -> dict:
    """The form values the script's directives (``jobs.spec.parse_script``) give, in the form's units
    (a field the script does not set is absent). Unparseable scripts give {} (the directive table
    says why)."""
    if parsed.error is not None:
        return {}
    try:
        request = script_request(list(parsed.directives))
    except DirectiveError:
        return {}
    options = request.options
    values: dict = {}
    if request.name:
        values["name"] = request.name
    if request.partition:
        values["partition"] = request.partition
    if request.gpu_type:
        values["gpu_type"] = request.gpu_type
    if request.gpu_form:
        if request.gpu_form == "gpus":
            values["gpus"] = request.gpu_count
        elif request.gpu_form in ("gres", "gpus-per-node") and request.nodes_min == request.nodes_max:
            values["gpus"] = request.gpu_count * request.nodes_max
    if "nodes" in options and request.nodes_min == request.nodes_max:
        values["nodes"] = request.nodes_max
    if request.ntasks is not None:
        values["ntasks"] = request.ntasks
    if request.cpus_per_task is not None:
        values["cpus_per_task"] = request.cpus_per_task
    if request.cpus_per_gpu is not None:
        values["cpus_per_gpu"] = request.cpus_per_gpu
    if request.mem_mb and memory_gb_exact(request.mem_mb):
        values["memory_gb"] = memory_gb_exact(request.mem_mb)
    if request.time_limit_minutes:
        values["time_limit_minutes"] = request.time_limit_minutes
    if request.array:
        values["array"] = request.array
    return values


def overrides_only(values: dict, parsed: ParsedScript) -> dict:
    """``values`` (cleaned form fields) with every field that equals the script's directive
    (``parsed``: the script's parse) emptied: what is left overrides the script."""
    from_script = fields_from_script(parsed)
    kept = dict(values)
    for name in SCRIPT_FIELDS:
        if name in kept and name in from_script and kept[name] == from_script[name]:
            kept[name] = None
    if kept.get("nodes") is not None and values.get("gpus") is not None:
        kept["gpus"] = values["gpus"]
    return kept
