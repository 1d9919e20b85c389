"""The one job spec: a batch script's ``#SBATCH`` directives plus the fields given through the API,
the form or the CLI, checked against the synced inventory, as the effective request Slurm will get.

- The script's directives are read by the one parser (``gpuportal_sbatch.directives``), exactly
  as sbatch reads them; what sbatch would refuse is a 400 naming the line.
- Explicit fields override the script's directives, as sbatch's command line does: they become the
  request's command line, with the portal's output files, the team's account and the portal's tag;
  the directives they replace (the same option, or one Slurm holds mutually exclusive with it) are
  turned into comments, so Slurm never gets two options it refuses together. That request
  (portal.slurm.types.JobRequest) is built here, once, stored with the job (``Job.request``), and
  handed by the relay to the gateway unchanged.
- The cluster: the ``cluster`` field, else the script's ``-M``/``--clusters`` (one name the portal
  serves; several or ``all``, which sbatch would resolve to the one that starts the job soonest, are
  a 400), else the partition's (``Inventory.capacity``). The job goes to that cluster's gateway,
  which never passes a cluster option to sbatch (portal.slurm.request).
- Everything else the script says reaches Slurm unchanged (it stays in the script).
- ``gpus`` is what Slurm allocates to one job (one array task): ``--exclusive`` gets every GPU of its
  nodes, ``--gpus-per-task`` × tasks, per-node forms × nodes.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.utils import timezone

from gpuportal_sbatch.directives import (
    CLUSTER_OPTIONS,
    Directive,
    DirectiveError,
    ScriptRequest,
    apply_overrides,
    begin_latest,
    check_mail_type,
    script_request,
)
from jobs.dependencies import depends_on_clean
from jobs.inventory import (
    ClusterChoiceError,
    Inventory,
    PartitionCapacity,
    _inventory_load,
    inventory,
    partition_capacity,
    spec_accounts,
)
from jobs.job_fields import OPTION_OF_FIELD
from jobs.spec_fields import (
    CONTROL_CHARS_RE,
    DEFAULT_JOB_NAME,
    DEFAULT_SHEBANG,
    ENV_NAME_RE,
    FIELD_OF_OPTION,
    JOB_NAME_RE,
    MAX_ENV_ENTRIES,
    MAX_ENV_VALUE_BYTES,
    MAX_GPUS,
    MAX_INT_FIELD,
    MAX_SCRIPT_BYTES,
    ParsedScript,
    _absolute,
    _as_int,
    _clean_environment,
    _clean_script,
    _describe,
    _Errors,
    _path_ok,
    parse_script,
)
from jobs.spec_policy import _check_against, _check_policy, _check_release, check_image, check_kubernetes
from portal.exceptions import ApplicationError
from portal.slurm.request import job_request, merged_options
from portal.slurm.types import JobRequest

# The spec is one module per concern (issue 18): the inventory (jobs.inventory), the fields
# (jobs.spec_fields), the partition's and cluster's limits (jobs.spec_policy); their names stay
# importable from here.
__all__ = [
    "CONTROL_CHARS_RE", "DEFAULT_JOB_NAME", "DEFAULT_SHEBANG", "ENV_NAME_RE", "FIELD_OF_OPTION", "JOB_NAME_RE",
    "MAX_ENV_ENTRIES", "MAX_ENV_VALUE_BYTES", "MAX_GPUS", "MAX_INT_FIELD", "MAX_SCRIPT_BYTES", "REFUSED_OPTIONS",
    "ParsedScript", "output_files", "parse_script",
    "ClusterChoiceError", "Inventory", "PartitionCapacity", "ValidSpec", "_Errors", "_absolute", "_as_int",
    "_check_against", "_check_policy", "_clean_environment", "_clean_script", "_describe", "_inventory_load",
    "_path_ok", "directives_table", "inventory", "overrides_has", "partition_capacity", "spec_accounts",
    "validate_job_spec",
]  # fmt: skip

# sbatch options the portal refuses on purpose in a script, and why (the closing note lists them).
REFUSED_OPTIONS = {
    "uid": "the portal runs every job as its submitter",
    "gid": "the portal runs every job with its submitter's group",
    "export": "jobs start with a clean environment (--export=NONE); give variables in the job's environment",
    "export-file": "jobs start with a clean environment (--export=NONE); give variables in the job's environment",
    "wrap": "the script is the job",
    "hold": "the portal cannot release a held job (it would hold budget forever)",
    "wait": "the portal follows the job itself",
    "test-only": "the portal submits jobs, it does not test them",
    "help": "not a job option",
    "usage": "not a job option",
    "version": "not a job option",
    "autocomplete": "not a job option",
    "priority": "only Slurm administrators set priorities",
    "reservation": "reservations come with bookings: give the booking instead",
}


def _check_begin(directive: Directive, errors: _Errors) -> None:
    """--begin at most JOB_BEGIN_MAX_DAYS ahead (its budget hold waits with the job)."""
    now = timezone.now()
    try:
        latest = begin_latest(directive.value or "", now=now, line=directive.line)
    except DirectiveError as exc:
        errors.directive(directive, exc.message)
        return
    if latest > now + dt.timedelta(days=settings.JOB_BEGIN_MAX_DAYS):
        errors.directive(
            directive,
            f"--begin may defer a job by at most {settings.JOB_BEGIN_MAX_DAYS} days (JOB_BEGIN_MAX_DAYS): "
            "its budget stays reserved while it waits.",
        )


@dataclass
class ValidSpec:
    """The normalised, checked job spec: what Slurm will allocate, and the command-line overrides."""

    name: str
    script: str
    partition: str
    gpu_type: str
    gpus: int  # GPUs Slurm allocates to one job (one array task)
    nodes: int
    cpus_per_gpu: int | None
    memory_gb: int | None
    time_limit_minutes: int
    workdir: str
    environment: dict[str, str]
    capacity: PartitionCapacity = field(repr=False)
    submit_dir: str = ""  # where it is submitted from (SLURM_SUBMIT_DIR): the field, else the user's default
    ntasks: int = 1
    cpus_per_task: int | None = None
    exclusive: bool = False
    array: str = ""
    array_tasks: int = 1
    array_throttle: int | None = None
    qos: str = ""
    constraint: str = ""
    # where stdout / stderr go: absolute path patterns as sbatch expands them (%j, %A, %a, ...): the
    # script's, else the portal's (JOB_OUTPUT_PATTERN); no stderr: with stdout, as in sbatch
    output: str = ""
    error: str = ""
    request: JobRequest | None = field(default=None, repr=False)  # what Slurm gets: built once, here

    @property
    def total_gpus(self) -> int:
        """GPUs of all array tasks."""
        return self.gpus * self.array_tasks


def validate_job_spec(
    *,
    name: str | None,
    script: str | None,
    partition: str | None,
    gpu_type: str | None,
    gpus: Any,
    nodes: Any,
    cpus_per_gpu: Any,
    memory_gb: Any,
    time_limit_minutes: Any,
    workdir: str | None,
    environment: dict | None,
    submit_dir: str | None = None,
    default_submit_dir: str = "/",
    account: str = "",
    accounts: Mapping[str, str] | None = None,
    cluster: str | None = None,
    ntasks: Any = None,
    cpus_per_task: Any = None,
    exclusive: bool | None = None,
    array: str | None = None,
    qos: str | None = None,
    constraint: str | None = None,
    depends_on: Any = None,
    image: str | None = None,
    check_script: bool = True,
    cache: dict | None = None,
    parsed: ParsedScript | None = None,
    tag: str = "",
) -> ValidSpec:
    """Check a job spec (script directives + explicit fields) against the rules and the synced
    cluster inventory. Collects every problem and raises one ApplicationError naming the fields
    (``script`` for a directive, with its line). ``None``/"" for a field: the script decides.
    ``account``: the team's Slurm account (a script's --account must name it); ``accounts``
    instead: its account on each cluster it has access to ({cluster name: account}), the one of the
    cluster the partition picks (or ``cluster`` names, else the script's ``-M``/``--clusters``; "" /
    None: from the partition) applies, and a cluster not in it is refused (``cluster``, or ``script``
    naming the line).
    ``submit_dir``: where the job is submitted from (the CLI's own directory; None/"": the user's
    ``default_submit_dir``, jobs.workdirs): the job starts there unless ``workdir`` (the field, an
    override of --chdir) or the script's --chdir say otherwise; relative paths are resolved against it.
    ``cache``: a dict kept across the specs of one batch, so the inventory is read once per partition.
    ``parsed``: the script's parse when the caller has it (jobs.spec_fields.parse_script: read once
    per request). ``depends_on``: portal job ids the job waits for (jobs.dependencies: the relay sends
    them as --dependency, replacing the script's). ``image``: a Kubernetes job's container image
    (jobs.spec_policy.check_image). ``tag``: the portal's tag of the job (its --comment). The spec's ``request`` is what
    Slurm gets (portal.slurm.request.job_request: the directives and the command line merged once),
    stored with the job and handed to the gateway unchanged."""
    cache = {} if cache is None else cache
    errors = _Errors()
    script, directives = _read_script(script, parsed=parsed, check=check_script, errors=errors)
    _check_directives(directives, account="" if accounts is not None else account, errors=errors)
    script_options = {d.option: d for d in directives}
    line = _CommandLine()
    name = _job_name(name, script_options, line, errors)
    gpus_n = _field_overrides(dict(nodes=nodes, ntasks=ntasks, cpus_per_task=cpus_per_task, cpus_per_gpu=cpus_per_gpu,
                                   memory_gb=memory_gb, time_limit_minutes=time_limit_minutes, exclusive=exclusive,
                                   array=array, qos=qos, constraint=constraint, gpus=gpus), line, errors)  # fmt: skip
    gpu_type = (gpu_type or "").strip()
    if gpus_n is not None or gpu_type:
        _gpu_override(_read_request(apply_overrides(directives, line.directives), errors), gpus_n, gpu_type, line.add, errors)
    submit_dir, workdir = _directories(submit_dir, workdir, default_submit_dir, script_options, line, errors)
    environment_clean = _clean_environment(environment, errors)
    parents = depends_on_clean(depends_on, errors)
    capacity, chosen_by = _placement(partition, cluster, directives, script_options, line, cache, errors)
    if capacity is not None and accounts is not None:
        capacity, account = _team_account(capacity, accounts, chosen_by, script_options, errors)

    # what Slurm gets: the script's directives and the command line, merged ONCE (the options that
    # choose a cluster out: the cluster is the job's, its gateway's)
    command_line = [(d.option, d.value) for d in line.directives]
    command_line += [("account", account)] if account else []
    command_line += [("comment", tag)] if tag else []
    effective = merged_options(directives, command_line, relay_sets=("dependency",) if parents else ())
    request = _read_request(effective, errors)
    spec = None
    if capacity is not None and request is not None:
        _check_release(directives, capacity, errors)
        _check_policy(cache["inventory"].policy(capacity), capacity, request, errors, account)
        check_kubernetes(capacity, effective, script, errors)
        image = check_image(capacity, image, errors)
        spec = _check_against(capacity, request, errors)
    if errors or spec is None:
        _raise(errors)

    output, error = output_files(workdir=workdir, array=spec["array"],
                                 output=_absolute(request.output, workdir) if request.output else "",
                                 error=_absolute(request.error, workdir) if request.error else "")  # fmt: skip
    if not request.output:  # the portal's files where the script names none (sbatch's rules for stderr);
        # they replace no directive: added to the command line and to the merged options alike
        files = [("output", output)] + ([("error", error)] if error and not request.error else [])
        command_line += files
        effective += [Directive(option, value, 0, "") for option, value in files]
    slurm_request = job_request(
        script=script, directives=directives, command_line=command_line, effective=effective, workdir=workdir,
        submit_dir=submit_dir, submit_dir_default=submit_dir == default_submit_dir, environment=environment_clean,
        gpus=spec["gpus"], gpu_type=spec["gpu_type"], nodes=spec["nodes"], time_limit_minutes=spec["time_limit_minutes"],
        array_tasks=spec["array_tasks"], depends_on=parents, image=image or "",
    )  # fmt: skip
    spec.update(name=name, script=script, workdir=workdir, environment=environment_clean, submit_dir=submit_dir,
                output=output, error=error, request=slurm_request)  # fmt: skip
    return ValidSpec(**spec)


# ---------------------------------------------------------------- validate_job_spec's steps


class _CommandLine:
    """The options the given fields put on sbatch's command line, in order (each overrides the
    script's directive for it, as sbatch's command line does)."""

    def __init__(self) -> None:
        self.directives: list[Directive] = []

    def add(self, option: str, value: str | None) -> None:
        self.directives.append(Directive(option, value, 0, f"--{option}" + ("" if value is None else f"={value}")))

    def has(self, option: str) -> bool:
        return overrides_has(self.directives, option)


def _raise(errors: _Errors) -> None:
    """The one ApplicationError of a spec that cannot be submitted, naming every field."""
    if not errors:
        errors.add("script", "The job cannot be submitted.")
    first = next(iter(errors.values()))[0]
    raise ApplicationError(f"The job cannot be submitted: {first}", errors=dict(errors))


def _read_script(script, *, parsed: ParsedScript | None, check: bool, errors: _Errors) -> tuple[str, list[Directive]]:
    """The script as stored (``check``: cleaned, a shebang put first) and its directives, read once
    (``parsed``: the caller's parse), with their lines as in the stored script."""
    given = script
    script = _clean_script(script, errors) if check else (script or "")
    if not script:
        return script, []
    read = parse_script(given, parsed)
    read = read.shifted(script.count("\n") - read.text.count("\n"))
    if read.error is not None:
        errors.add("script", str(read.error))
    return script, list(read.directives)


def _check_directives(directives: list[Directive], *, account: str, errors: _Errors) -> None:
    """What the portal refuses in a script, each naming its line. ``account``: the team's one Slurm
    account a --account must name ("": checked per cluster, _team_account)."""
    for directive in directives:
        if directive.option in REFUSED_OPTIONS:
            errors.directive(directive, f"the portal does not accept --{directive.option}: {REFUSED_OPTIONS[directive.option]}.")
        elif directive.option == "nice" and (directive.value or "").strip().startswith("-"):
            errors.directive(directive, "a negative --nice needs Slurm administrator rights.")
        elif directive.option == "begin":
            _check_begin(directive, errors)
        elif directive.option == "mail-type":
            try:
                check_mail_type(directive.value or "", line=directive.line)
            except DirectiveError as exc:
                errors.directive(directive, exc.message)
        elif directive.option == "account" and account and directive.value != account:
            errors.directive(directive, f"jobs of this team run in Slurm account {account!r}, not {directive.value!r}.")


def _read_request(effective: list[Directive], errors: _Errors) -> ScriptRequest | None:
    """What merged options ask Slurm for; None after an error naming the line (or the field)."""
    try:
        return script_request(effective)
    except DirectiveError as exc:
        source = next((d for d in effective if d.option == exc.option and d.line == exc.line), None)
        errors.directive(source, exc.message) if source else errors.add("script", str(exc))
        return None


def _job_name(name, script_options: dict, line: _CommandLine, errors: _Errors) -> str | None:
    """The job's name: the field (an override), else the script's --job-name, else the default."""
    if name is not None and name != "":
        name = name.strip() if isinstance(name, str) else None
        if name is None or not JOB_NAME_RE.match(name):
            errors.add("name", "Use 1–128 letters, digits, '.', '_' or '-' (no spaces).")
        else:
            line.add(OPTION_OF_FIELD["name"], name)
        return name
    if "job-name" in script_options:
        name = (script_options["job-name"].value or "").strip()
        if not name or len(name) > 128 or CONTROL_CHARS_RE.search(name):
            errors.directive(script_options["job-name"], "a job name of 1–128 characters without control characters.")
        return name
    return DEFAULT_JOB_NAME


def _field_overrides(given: dict, line: _CommandLine, errors: _Errors) -> int | None:
    """Each given field as the sbatch option it overrides (jobs.job_fields: the one field <-> option
    table), checked. Returns the GPUs given (None: the script decides; _gpu_override sends them)."""
    gpus = _as_int(given.pop("gpus"), "gpus", errors, required=False)
    if gpus is not None and gpus > MAX_GPUS:
        errors["gpus"] = [f"At most {MAX_GPUS}."]
        gpus = None
    for field_name in ("nodes", "ntasks", "cpus_per_task", "cpus_per_gpu", "memory_gb", "time_limit_minutes"):
        value = _as_int(given[field_name], field_name, errors, required=False)
        if value is not None:
            line.add(OPTION_OF_FIELD[field_name], f"{value}G" if field_name == "memory_gb" else str(value))
    if given["exclusive"]:
        line.add(OPTION_OF_FIELD["exclusive"], None)
    for field_name in ("array", "qos", "constraint"):
        value = given[field_name]
        if value not in (None, ""):
            if not isinstance(value, str) or CONTROL_CHARS_RE.search(value) or len(value) > 1024:
                errors.add(field_name, "At most 1024 characters, without control characters.")
            else:
                line.add(OPTION_OF_FIELD[field_name], value.strip())
    return gpus


def _directories(submit_dir, workdir, default_submit_dir: str, script_options: dict, line: _CommandLine,
                 errors: _Errors) -> tuple[str, str]:  # fmt: skip
    """(where the job is submitted from: the field, absolute, else the user's default; where it
    starts: the field, else the script's --chdir resolved against the submit directory, else that)."""
    if submit_dir not in (None, ""):
        if not isinstance(submit_dir, str) or not os.path.isabs(submit_dir):
            errors.add("submit_dir", "Give an absolute path (starting with /).")
            submit_dir = default_submit_dir
        elif not _path_ok(submit_dir) or "%" in submit_dir:
            errors.add("submit_dir", "At most 1024 characters, without control characters or '%'.")
            submit_dir = default_submit_dir
        else:
            submit_dir = os.path.normpath(submit_dir)
    else:
        submit_dir = default_submit_dir
    if workdir not in (None, ""):
        if not isinstance(workdir, str) or not os.path.isabs(workdir):
            errors.add("workdir", "Give an absolute path (starting with /).")
        elif not _path_ok(workdir) or "%" in workdir:
            errors.add("workdir", "At most 1024 characters, without control characters or '%'.")
        else:
            workdir = os.path.normpath(workdir)
            line.add(OPTION_OF_FIELD["workdir"], workdir)
    elif "chdir" in script_options:
        chdir = script_options["chdir"]
        if not _path_ok(chdir.value or "") or "%" in (chdir.value or ""):
            errors.directive(chdir, "a directory of at most 1024 characters, without control characters or '%'.")
        workdir = _absolute(chdir.value or ".", submit_dir)
        if not (chdir.value or "").startswith("/"):
            line.add("chdir", workdir)  # sbatch resolves it against its own directory: the submit directory
    else:
        workdir = submit_dir
        line.add("chdir", workdir)
    return submit_dir, workdir


def _placement(partition, cluster, directives: list[Directive], script_options: dict, line: _CommandLine, cache: dict,
               errors: _Errors) -> tuple[PartitionCapacity | None, Directive | None]:  # fmt: skip
    """The partition and cluster the job goes to, read from the inventory (once per batch: ``cache``):
    (its capacity, or None after an error; the script's -M/--clusters when it chose the cluster)."""
    partition = (partition or "").strip()
    if partition:
        line.add(OPTION_OF_FIELD["partition"], partition)
    elif script_options.get("partition") and script_options["partition"].value:
        partition = script_options["partition"].value
        if "," in partition:
            errors.directive(script_options.get("partition"), "the portal submits to one partition; name one.")
    if "inventory" not in cache:
        cache["inventory"] = inventory()
    if not cache["inventory"].partitions:
        errors.add("partition", "The cluster inventory has not been read yet; try again in a minute.")
        return None, None
    # the cluster: the field, else the script's -M/--clusters (as sbatch's command line overrides it)
    cluster = (cluster or "").strip() if isinstance(cluster, str) else ""
    chosen_by = None if cluster else next((d for d in reversed(directives) if d.option in CLUSTER_OPTIONS), None)
    if chosen_by is not None:
        cluster = _script_cluster(chosen_by, cache["inventory"], errors)
    if cluster is None:  # the script's choice is refused (above)
        return None, chosen_by
    key = ("partition", partition, cluster)
    if key not in cache:
        try:
            cache[key] = cache["inventory"].capacity(partition, cluster)
        except ClusterChoiceError as exc:
            cache[key] = exc
    capacity = cache[key]
    if isinstance(capacity, ClusterChoiceError):
        errors.directive(chosen_by, _lower_first(str(capacity)), fallback="cluster")
        return None, chosen_by
    if capacity is None:
        message = f"No such partition: {partition!r}." if partition else "The cluster has no default partition."
        errors.directive(script_options.get("partition") if not line.has("partition") else None, message, fallback="partition")
    elif not partition:
        line.add("partition", capacity.name)
    return capacity, chosen_by


def _team_account(capacity: PartitionCapacity, accounts: Mapping[str, str], chosen_by: Directive | None,
                  script_options: dict, errors: _Errors) -> tuple[PartitionCapacity | None, str]:  # fmt: skip
    """The team's Slurm account on the job's cluster (a script's --account must name it); (None, "")
    when the team has none there."""
    account = accounts.get(capacity.cluster, "")
    if not account:
        errors.directive(chosen_by, f"this team has no Slurm account on cluster {capacity.cluster!r}.", fallback="cluster")
        return None, ""
    given = script_options.get("account")
    if given is not None and given.value != account:
        errors.directive(given, f"jobs of this team run in Slurm account {account!r}, not {given.value!r}.")
    return capacity, account


def output_files(*, workdir: str, array: str = "", output: str = "", error: str = "") -> tuple[str, str]:
    """Where a job's stdout and stderr go (absolute patterns; stderr "": with stdout, as in sbatch):
    the script's --output/--error (``output``, ``error``: absolute), else JOB_OUTPUT_PATTERN's in
    force at submission (with {stream}: a file per stream)."""
    pattern = settings.JOB_OUTPUT_PATTERN
    slurm_id = "%A_%a" if array else "%j"
    if not output:
        output = pattern.format(workdir=workdir, slurm_job_id=slurm_id, stream="out")
        if not error and "{stream}" in pattern:
            error = pattern.format(workdir=workdir, slurm_job_id=slurm_id, stream="err")
    return output, error


def _gpu_override(request: ScriptRequest | None, gpus: int | None, gpu_type: str, override, errors: _Errors) -> None:
    """The GPUs given as fields, as a command-line option: a total (API) as GPUs per node when it
    divides evenly over the nodes; a type alone keeps the script's count and form. ``request``: what
    the script and the other fields ask for (the node count), None when it cannot be read."""
    if request is None:
        return
    type_ = gpu_type or request.gpu_type
    prefix = f"gpu:{type_}:" if type_ else "gpu:"
    if gpus is not None:
        if request.nodes_given and gpus % request.nodes_max:
            errors.add("gpus", f"{gpus} GPUs cannot be spread evenly over {request.nodes_max} nodes.")
        else:
            override("gres", f"{prefix}{gpus // request.nodes_max}")
    elif request.gpu_form:
        option = request.gpu_form
        override(option, f"{prefix}{request.gpu_count}" if option == "gres" else f"{type_}:{request.gpu_count}")
    else:
        override("gres", f"{prefix}1")


def overrides_has(overrides: list[Directive], option: str) -> bool:
    return any(d.option == option for d in overrides)


def _script_cluster(directive: Directive, known: Inventory, errors: _Errors) -> str | None:
    """The one cluster a script's ``-M``/``--clusters`` names (Inventory.capacity then says whether
    the portal serves it), or None after an error naming the line: the portal submits a job to one
    cluster, where sbatch given several (or ``all``) would pick the one that starts it soonest."""
    names = [name.strip().lower() for name in (directive.value or "").split(",") if name.strip()]  # as sbatch: any case
    if len(names) == 1 and names[0] != "all":
        return names[0]
    errors.directive(directive, f"the portal submits a job to one cluster: name one ({known.served()}).")
    return None


def _lower_first(message: str) -> str:
    return message[:1].lower() + message[1:]


# ---------------------------------------------------------------- what the form shows

_MEANING = {
    "job-name": "job name", "partition": "partition", "time": "time limit", "nodes": "nodes", "ntasks": "tasks",
    "ntasks-per-node": "tasks per node", "cpus-per-task": "CPUs per task", "cpus-per-gpu": "CPUs per GPU",
    "gres": "GPUs per node (--gres)", "gpus": "GPUs for the job", "gpus-per-node": "GPUs per node",
    "gpus-per-task": "GPUs per task", "mem": "memory per node (0: all of it)", "mem-per-cpu": "memory per CPU",
    "mem-per-gpu": "memory per GPU", "exclusive": "whole nodes (every GPU counts)", "array": "array tasks",
    "qos": "QOS", "constraint": "node features", "output": "stdout file", "error": "stderr file",
    "chdir": "working directory", "account": "account (must be the team's)", "signal": "signal before the end",
    "requeue": "requeue on failure", "mail-type": "mail on", "mail-user": "mail to",
    "clusters": "cluster (the cluster field overrides it)", "cluster": "cluster (the cluster field overrides it)",
}  # fmt: skip


def directives_table(parsed: ParsedScript) -> tuple[list[dict], str]:
    """The script's directives (``parse_script``) for the form (line, as written, option, what it
    sets), or an error naming the line. Pure: no inventory (the estimate checks the rest)."""
    if parsed.error is not None:
        return [], str(parsed.error)
    directives = parsed.directives
    try:
        request = script_request(list(directives))
    except DirectiveError as exc:
        return [], str(exc)
    rows = []
    for directive in directives:
        meaning = _MEANING.get(directive.option, "passed to Slurm unchanged")
        if directive.option in REFUSED_OPTIONS:
            meaning = f"refused: {REFUSED_OPTIONS[directive.option]}"
        elif directive.option == "array":
            meaning = f"{request.array_tasks} array tasks" + (f", at most {request.array_throttle} at once" if request.array_throttle else "")
        elif directive.option == "time" and request.time_limit_minutes:
            meaning = f"time limit {request.time_limit_minutes} min"
        rows.append({"line": directive.line, "text": directive.text, "option": directive.option, "meaning": meaning})
    return rows, ""
