"""The one job spec: a batch script's ``#SBATCH`` directives plus the fields given through the API,
the form or the CLI, checked against the synced inventory, as the effective request Slurm will get.

- The script's directives are read by the one parser (``gpuportal_cli.sbatch_directives``), exactly
  as sbatch reads them; what sbatch would refuse is a 400 naming the line.
- Explicit fields override the script's directives, as sbatch's command line does. The overrides
  are stored on the job (``Job.overrides``) and become the relay's command line; the gateway turns
  the script's directives they replace (the same option, or one Slurm holds mutually exclusive with
  it) into comments, so the argv never carries two options Slurm refuses together.
- Everything else the script says reaches Slurm unchanged (it stays in the script).
- ``gpus`` is what Slurm allocates to one job (one array task): ``--exclusive`` gets every GPU of its
  nodes, ``--gpus-per-task`` × tasks, per-node forms × nodes.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from gpuportal_cli.sbatch_directives import (
    Directive,
    DirectiveError,
    ScriptRequest,
    apply_overrides,
    parse_directives,
    script_request,
)
from jobs.constraints import unmatched
from portal.exceptions import ApplicationError
from portal.models import Cluster, ClusterPolicyInfo, NodeInfo, PartitionInfo
from portal.slurm import cluster_config
from portal.snapshots import INVENTORY, snapshot

JOB_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")  # no spaces: names end up in file names and CLI tables
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CONTROL_CHARS_RE = re.compile(r"[\x00-\x1f\x7f]")
MAX_SCRIPT_BYTES = 1024 * 1024
MAX_ENV_ENTRIES = 64
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_GPUS = 10_000  # sanity bound before the inventory check (keeps error messages readable)
DEFAULT_SHEBANG = "#!/bin/bash\n"
DEFAULT_JOB_NAME = "sbatch"  # what sbatch calls a job read from stdin without --job-name

# sbatch options the portal refuses on purpose in a script, and why (the closing note lists them).
REFUSED_OPTIONS = {
    "uid": "the portal runs every job as its submitter",
    "gid": "the portal runs every job with its submitter's group",
    "export": "jobs start with a clean environment (--export=NONE); give variables in the job's environment",
    "export-file": "jobs start with a clean environment (--export=NONE); give variables in the job's environment",
    "clusters": "the portal submits to its own cluster",
    "cluster": "the portal submits to its own cluster",
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

# API field -> the sbatch option it overrides (for errors named after the field the caller used)
FIELD_OF_OPTION = {
    "job-name": "name", "partition": "partition", "gres": "gpus", "gpus": "gpus", "nodes": "nodes",
    "cpus-per-gpu": "cpus_per_gpu", "mem": "memory_gb", "time": "time_limit_minutes", "chdir": "workdir",
    "ntasks": "ntasks", "cpus-per-task": "cpus_per_task", "exclusive": "exclusive", "array": "array",
    "qos": "qos", "constraint": "constraint",
}  # fmt: skip


# ---------------------------------------------------------------- inventory


@dataclass(frozen=True)
class PartitionCapacity:
    """What one partition of one cluster can ever give a job (from the synced inventory)."""

    name: str
    default_time_minutes: int | None
    max_time_minutes: int | None
    nodes: tuple[NodeInfo, ...]
    cluster_id: int | None = None
    cluster: str = ""
    cluster_row: Cluster | None = field(default=None, compare=False, repr=False)  # the job row points at it

    @property
    def gpu_types(self) -> list[str]:
        return sorted({n.gpu_type for n in self.nodes if n.gpu_type and n.gpus_total})

    def eligible_nodes(self, gpu_type: str) -> list[NodeInfo]:
        """Nodes with GPUs of that type ("" = any type)."""
        return [n for n in self.nodes if n.gpus_total and (not gpu_type or n.gpu_type == gpu_type)]


def spec_accounts(team) -> dict:
    """validate_job_spec's account arguments for a team: its one account when the portal serves one
    cluster (no query), else its account on each cluster it has access to (one query)."""
    from portal.selectors import team_cluster_accounts
    from portal.slurm import configured_clusters

    if len(configured_clusters()) == 1:
        return {"account": team.slurm_account}
    return {"accounts": team_cluster_accounts(team)}


class ClusterChoiceError(Exception):
    """The partition alone does not say which cluster (``ambiguous``: its clusters), or the
    requested cluster is not one the portal serves."""

    def __init__(self, message: str, ambiguous: tuple[str, ...] = ()):
        super().__init__(message)
        self.ambiguous = ambiguous


@dataclass(frozen=True)
class Inventory:
    """The synced inventory of every active cluster as the submit path reads it: each partition's
    capacity and each cluster's policy. Shared by the threads of a process (portal.snapshots):
    read-only."""

    partitions: dict[tuple[str, str], PartitionCapacity]  # (cluster name, partition name) -> capacity
    defaults: dict[str, str]  # cluster name -> its default partition
    default_cluster: str | None
    clusters: frozenset[str]  # the active clusters' names
    policies: dict[int, ClusterPolicyInfo]  # cluster id -> its policy

    def capacity(self, partition: str, cluster: str = "") -> PartitionCapacity | None:
        """The partition's capacity, or None when it is not in the inventory ("" = the default
        partition; of the default cluster unless ``cluster`` names one). A partition name alone picks
        its cluster when exactly one cluster has it, or the default cluster when it is one of several
        (as sbatch without --clusters submits to the local cluster); several others:
        ClusterChoiceError naming them, an unknown ``cluster`` too. No query."""
        if cluster:
            if cluster not in self.clusters:
                raise ClusterChoiceError(f"No such cluster: {cluster!r}.")
            name = partition or self.defaults.get(cluster)
            return self.partitions.get((cluster, name)) if name else None
        if not partition:
            name = self.defaults.get(self.default_cluster or "")
            return self.partitions.get((self.default_cluster, name)) if name else None
        found = [cap for (_cluster, name), cap in self.partitions.items() if name == partition]
        if len(found) > 1:
            # as sbatch without --clusters: the local (default) cluster when it has the partition
            local = [c for c in found if c.cluster == self.default_cluster]
            if local:
                return local[0]
            found.sort(key=lambda c: c.cluster)
            names = tuple(c.cluster for c in found)
            raise ClusterChoiceError(
                f"Partition {partition!r} exists on clusters {', '.join(names)}: name one in `cluster`.", ambiguous=names
            )
        return found[0] if found else None

    def policy(self, capacity: PartitionCapacity) -> ClusterPolicyInfo | None:
        return self.policies.get(capacity.cluster_id) if capacity.cluster_id is not None else None


def _inventory_load() -> Inventory:
    """Four queries: active clusters' partitions (with their cluster), nodes, policies, clusters."""
    parts = list(PartitionInfo.objects.filter(cluster__active=True).select_related("cluster"))
    nodes = {(n.cluster_id, n.name): n for n in NodeInfo.objects.order_by("name")}
    capacities = {
        (p.cluster.name, p.name): PartitionCapacity(
            p.name, p.default_time_minutes, p.max_time_minutes,
            tuple(nodes[(p.cluster_id, name)] for name in sorted(p.node_names) if (p.cluster_id, name) in nodes),
            cluster_id=p.cluster_id, cluster=p.cluster.name, cluster_row=p.cluster,
        )
        for p in parts
    }  # fmt: skip
    defaults = {p.cluster.name: p.name for p in parts if p.is_default}
    clusters = list(Cluster.objects.filter(active=True).order_by("name"))
    # the configured first cluster by name, not the recorded flag (which may lag a settings change)
    default_cluster = cluster_config().name
    policies = {policy.cluster_id: policy for policy in ClusterPolicyInfo.objects.all()}
    return Inventory(capacities, defaults, default_cluster, frozenset(c.name for c in clusters), policies)


def inventory() -> Inventory:
    """The inventory as of the last cluster_sync: this process's copy (portal.snapshots; no query
    while it is current), else four queries."""
    return snapshot(INVENTORY, _inventory_load)


def partition_capacity(partition: str, cluster: str = "") -> PartitionCapacity | None:
    """The partition's capacity (Inventory.capacity): from this process's copy of the inventory."""
    return inventory().capacity(partition, cluster)


# ---------------------------------------------------------------- the spec


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
    ntasks: int = 1
    cpus_per_task: int | None = None
    exclusive: bool = False
    array: str = ""
    array_tasks: int = 1
    array_throttle: int | None = None
    qos: str = ""
    constraint: str = ""
    output: str = ""  # absolute path patterns as sbatch expands them (%j, %A, %a, ...)
    error: str = ""
    overrides: list[list] = field(default_factory=list)  # [[option, value], ...] for the command line
    directives: list[dict] = field(default_factory=list)  # the effective options, for display

    @property
    def total_gpus(self) -> int:
        """GPUs of all array tasks."""
        return self.gpus * self.array_tasks


# The largest value the job and template columns (PostgreSQL integer) hold: a larger number is the
# client's error (400), never the database's (500).
MAX_INT_FIELD = 2**31 - 1


def _as_int(
    value: Any, name: str, errors: dict, *, minimum: int = 1, maximum: int = MAX_INT_FIELD, required: bool = True
) -> int | None:
    if value is None or value == "":
        if required:
            errors[name] = ["This field is required."]
        return None
    if isinstance(value, bool):
        errors[name] = ["Must be a whole number."]
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        errors[name] = ["Must be a whole number."]
        return None
    if isinstance(value, float) and value != number:
        errors[name] = ["Must be a whole number."]
        return None
    if number < minimum:
        errors[name] = [f"Must be at least {minimum}."]
        return None
    if number > maximum:
        errors[name] = [f"Must be at most {maximum}."]
        return None
    return number


def _describe(directive: Directive) -> str:
    return f"line {directive.line}: #SBATCH {directive.text}" if directive.line else f"--{directive.option}"


class _Errors(dict):
    """Errors by field: a directive from the script is reported under ``script`` (naming its line),
    one from an API field under that field."""

    def add(self, field_name: str, message: str) -> None:
        self.setdefault(field_name, []).append(message)

    def directive(self, directive: Directive | None, message: str, *, fallback: str = "script", field: str = "") -> None:
        """``field``: the API field to name when the directive came from a field (default: the
        field of its option)."""
        if directive is None:
            self.add(fallback, message[:1].upper() + message[1:])
        elif directive.line:
            self.add("script", f"{_describe(directive)}: {message}")
        else:
            self.add(field or FIELD_OF_OPTION.get(directive.option, fallback), message[:1].upper() + message[1:])


def _clean_script(script: Any, errors: _Errors) -> str:
    if not isinstance(script, str) or not script.strip():
        errors.add("script", "The script is empty.")
    elif "\x00" in script:
        errors.add("script", "The script must not contain NUL bytes.")
    elif len(script.encode("utf-8", errors="surrogatepass")) > MAX_SCRIPT_BYTES:
        errors.add("script", f"The script is larger than {MAX_SCRIPT_BYTES // 1024} KiB.")
    else:
        script = script.replace("\r\n", "\n")  # scripts pasted from Windows break bash otherwise
        if not script.startswith("#!"):
            script = DEFAULT_SHEBANG + script
        return script
    return ""


def _clean_environment(environment: Any, errors: _Errors) -> dict[str, str]:
    env_clean: dict[str, str] = {}
    if environment is None:
        return env_clean
    if not isinstance(environment, dict):
        errors.add("environment", "Give an object of NAME: value pairs.")
    elif len(environment) > MAX_ENV_ENTRIES:
        errors.add("environment", f"At most {MAX_ENV_ENTRIES} variables.")
    else:
        for key, value in environment.items():
            if not isinstance(key, str) or not ENV_NAME_RE.match(key):
                errors.add("environment", f"Invalid variable name {key!r}: use letters, digits and '_', not starting with a digit.")
            elif not isinstance(value, (str, int, float)) or isinstance(value, bool):
                errors.add("environment", f"{key}: the value must be a string.")
            elif "\x00" in str(value) or len(str(value).encode()) > MAX_ENV_VALUE_BYTES:
                errors.add("environment", f"{key}: the value must not contain NUL bytes or exceed 32 KiB.")
            else:
                env_clean[key] = str(value)
    return env_clean


def _path_ok(path: str) -> bool:
    return len(path) <= 1024 and not CONTROL_CHARS_RE.search(path)


def _absolute(path: str, base: str) -> str:
    return posixpath.normpath(path if path.startswith("/") else posixpath.join(base, path))


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
    account: str = "",
    accounts: Mapping[str, str] | None = None,
    cluster: str | None = None,
    ntasks: Any = None,
    cpus_per_task: Any = None,
    exclusive: bool | None = None,
    array: str | None = None,
    qos: str | None = None,
    constraint: str | None = None,
    check_script: bool = True,
    cache: dict | None = None,
) -> ValidSpec:
    """Check a job spec (script directives + explicit fields) against the rules and the synced
    cluster inventory. Collects every problem and raises one ApplicationError naming the fields
    (``script`` for a directive, with its line). ``None``/"" for a field: the script decides.
    ``account``: the team's Slurm account (a script's --account must name it); ``accounts``
    instead: its account on each cluster it has access to ({cluster name: account}), the one of the
    cluster the partition picks (or ``cluster`` names; "" / None: from the partition) applies, and a
    cluster not in it is refused (``cluster``).
    ``cache``: a dict kept across the specs of one batch, so the inventory is read once per partition."""
    cache = {} if cache is None else cache
    errors = _Errors()

    script = _clean_script(script, errors) if check_script else (script or "")
    try:
        directives = parse_directives(script) if script else []
    except DirectiveError as exc:
        errors.add("script", str(exc))
        directives = []
    for directive in directives:
        if directive.option in REFUSED_OPTIONS:
            errors.directive(directive, f"the portal does not accept --{directive.option}: {REFUSED_OPTIONS[directive.option]}.")
        elif directive.option == "nice" and (directive.value or "").strip().startswith("-"):
            errors.directive(directive, "a negative --nice needs Slurm administrator rights.")
        elif directive.option == "account" and account and accounts is None and directive.value != account:
            errors.directive(directive, f"jobs of this team run in Slurm account {account!r}, not {directive.value!r}.")
    script_options = {d.option: d for d in directives}

    # explicit fields -> command-line overrides
    overrides: list[Directive] = []

    def override(option: str, value: str | None) -> None:
        overrides.append(Directive(option, value, 0, f"--{option}" + ("" if value is None else f"={value}")))

    name_given = name is not None and name != ""
    if name_given:
        name = name.strip() if isinstance(name, str) else None
        if name is None or not JOB_NAME_RE.match(name):
            errors.add("name", "Use 1–128 letters, digits, '.', '_' or '-' (no spaces).")
        else:
            override("job-name", name)
    elif "job-name" in script_options:
        name = (script_options["job-name"].value or "").strip()
        if not name or len(name) > 128 or CONTROL_CHARS_RE.search(name):
            errors.directive(script_options["job-name"], "a job name of 1–128 characters without control characters.")
    else:
        name = DEFAULT_JOB_NAME

    gpus_n = _as_int(gpus, "gpus", errors, required=False)
    if gpus_n is not None and gpus_n > MAX_GPUS:
        errors["gpus"] = [f"At most {MAX_GPUS}."]
        gpus_n = None
    nodes_n = _as_int(nodes, "nodes", errors, required=False)
    cpus_n = _as_int(cpus_per_gpu, "cpus_per_gpu", errors, required=False)
    memory_n = _as_int(memory_gb, "memory_gb", errors, required=False)
    time_n = _as_int(time_limit_minutes, "time_limit_minutes", errors, required=False)
    ntasks_n = _as_int(ntasks, "ntasks", errors, required=False)
    cpus_task_n = _as_int(cpus_per_task, "cpus_per_task", errors, required=False)
    gpu_type = (gpu_type or "").strip()
    if nodes_n is not None:
        override("nodes", str(nodes_n))
    if ntasks_n is not None:
        override("ntasks", str(ntasks_n))
    if cpus_task_n is not None:
        override("cpus-per-task", str(cpus_task_n))
    if cpus_n is not None:
        override("cpus-per-gpu", str(cpus_n))
    if memory_n is not None:
        override("mem", f"{memory_n}G")
    if time_n is not None:
        override("time", str(time_n))
    if exclusive:
        override("exclusive", None)
    for option, value in (("array", array), ("qos", qos), ("constraint", constraint)):
        if value not in (None, ""):
            if not isinstance(value, str) or CONTROL_CHARS_RE.search(value) or len(value) > 1024:
                errors.add(FIELD_OF_OPTION[option], "At most 1024 characters, without control characters.")
            else:
                override(option, value.strip())

    # what the script asks for after the overrides so far (GPUs need the node count)
    def read(effective: list[Directive]) -> ScriptRequest | None:
        try:
            return script_request(effective)
        except DirectiveError as exc:
            source = next((d for d in effective if d.option == exc.option and d.line == exc.line), None)
            errors.directive(source, exc.message) if source else errors.add("script", str(exc))
            return None

    request = read(apply_overrides(directives, overrides))
    if request is not None and (gpus_n is not None or gpu_type):
        # the GPUs given as fields: a total (API) as GPUs per node when it divides evenly
        script_type = request.gpu_type
        node_count = request.nodes_max
        type_ = gpu_type or script_type
        prefix = f"gpu:{type_}:" if type_ else "gpu:"
        if gpus_n is not None:
            if request.nodes_given and gpus_n % node_count:
                errors.add("gpus", f"{gpus_n} GPUs cannot be spread evenly over {node_count} nodes.")
            else:
                override("gres", f"{prefix}{gpus_n // node_count}")
        elif request.gpu_form:
            option = {"gres": "gres", "gpus-per-node": "gpus-per-node", "gpus": "gpus", "gpus-per-task": "gpus-per-task"}[request.gpu_form]
            override(option, f"{prefix}{request.gpu_count}" if option == "gres" else f"{type_}:{request.gpu_count}")
        else:
            override("gres", f"{prefix}1")
        request = read(apply_overrides(directives, overrides))

    # workdir: the field, else the script's --chdir (relative: against the default), else the default
    if workdir not in (None, ""):
        if not isinstance(workdir, str) or not os.path.isabs(workdir):
            errors.add("workdir", "Give an absolute path (starting with /).")
        elif not _path_ok(workdir) or "%" in workdir:
            errors.add("workdir", "At most 1024 characters, without control characters or '%'.")
        else:
            workdir = os.path.normpath(workdir)
            override("chdir", workdir)
    elif "chdir" in script_options:
        chdir = script_options["chdir"]
        if not _path_ok(chdir.value or "") or "%" in (chdir.value or ""):
            errors.directive(chdir, "a directory of at most 1024 characters, without control characters or '%'.")
        workdir = _absolute(chdir.value or ".", settings.JOB_DEFAULT_WORKDIR)
        if not (chdir.value or "").startswith("/"):
            override("chdir", workdir)  # sbatch would resolve it against its own directory
    else:
        workdir = settings.JOB_DEFAULT_WORKDIR
        override("chdir", workdir)
    environment_clean = _clean_environment(environment, errors)

    # the inventory
    partition = (partition or "").strip()
    if partition:
        override("partition", partition)
    elif request is not None and request.partition:
        partition = request.partition
        if "," in partition:
            errors.directive(script_options.get("partition"), "the portal submits to one partition; name one.")
    capacity = None
    if "inventory" not in cache:
        cache["inventory"] = inventory()
    if not cache["inventory"].partitions:
        errors.add("partition", "The cluster inventory has not been read yet; try again in a minute.")
    else:
        cluster = (cluster or "").strip() if isinstance(cluster, str) else ""
        key = ("partition", partition, cluster)
        if key not in cache:
            try:
                cache[key] = cache["inventory"].capacity(partition, cluster)
            except ClusterChoiceError as exc:
                cache[key] = exc
        capacity = cache[key]
        if isinstance(capacity, ClusterChoiceError):
            errors.add("cluster", str(capacity))
            capacity = None
        elif capacity is None:
            message = f"No such partition: {partition!r}." if partition else "The cluster has no default partition."
            errors.directive(script_options.get("partition") if not overrides_has(overrides, "partition") else None, message, fallback="partition")
        elif not partition:
            override("partition", capacity.name)
    if capacity is not None and accounts is not None:
        account = accounts.get(capacity.cluster, "")
        if not account:
            errors.add("cluster", f"This team has no Slurm account on cluster {capacity.cluster!r}.")
            capacity = None
        else:
            given = script_options.get("account")
            if given is not None and given.value != account:
                errors.directive(given, f"jobs of this team run in Slurm account {account!r}, not {given.value!r}.")

    spec = None
    if capacity is not None and request is not None:
        _check_policy(cache["inventory"].policy(capacity), capacity, request, errors, account)
        spec = _check_against(capacity, request, errors, script_options)
    if errors or spec is None:
        if not errors:
            errors.add("script", "The job cannot be submitted.")
        first = next(iter(errors.values()))[0]
        raise ApplicationError(f"The job cannot be submitted: {first}", errors=dict(errors))

    if account:
        override("account", account)
    effective = apply_overrides(directives, overrides)
    spec.update(
        name=name, script=script, workdir=workdir, environment=environment_clean,
        output=_absolute(request.output, workdir) if request.output else "",
        error=_absolute(request.error, workdir) if request.error else "",
        overrides=[[d.option, d.value] for d in overrides],
        directives=[{"option": d.option, "value": d.value, "line": d.line} for d in effective],
    )  # fmt: skip
    return ValidSpec(**spec)


def overrides_has(overrides: list[Directive], option: str) -> bool:
    return any(d.option == option for d in overrides)


def _check_policy(policy: ClusterPolicyInfo | None, capacity: PartitionCapacity, request: ScriptRequest, errors: _Errors, account: str) -> None:
    """QOS, constraint and array size against what the last sync read from the cluster, in the
    words of Slurm's refusal. Nothing read yet (no policy): QOS and features are left to Slurm, the
    array to the SLURM_MAX_ARRAY_SIZE setting."""
    opt = request.options.get
    max_array = (policy.max_array_size if policy else None) or settings.SLURM_MAX_ARRAY_SIZE
    if request.array_indexes and max_array and max(request.array_indexes) >= max_array:
        errors.directive(
            opt("array"), f"invalid job array specification: index {max(request.array_indexes)} is beyond the cluster's "
            f"MaxArraySize ({max_array}: indexes 0–{max_array - 1}).", fallback="array",
        )  # fmt: skip
    if policy is None:
        return
    qos = (request.qos or "").strip()
    if qos and qos.lower() not in {q.lower() for q in policy.qos}:  # Slurm matches QOS names case-insensitively
        known = ", ".join(policy.qos) or "none"
        errors.directive(opt("qos"), f"invalid qos specification: the cluster has no QOS {qos!r} (QOS here: {known}).", fallback="qos")
    elif qos and account in policy.account_qos and qos.lower() not in {q.lower() for q in policy.account_qos[account]}:
        allowed = ", ".join(policy.account_qos[account])
        errors.directive(opt("qos"), f"invalid qos specification: account {account!r} may use QOS {allowed}, not {qos!r}.", fallback="qos")
    constraint = (request.constraint or "").strip()
    missing = unmatched(constraint, [n.features for n in capacity.nodes]) if constraint else None
    if missing:
        known = ", ".join(sorted({f for n in capacity.nodes for f in n.features})) or "none"
        wanted = [f"{term.partition('*')[2]} nodes with feature {term.partition('*')[0]}" if "*" in term else f"feature {term}" for term in missing]
        errors.directive(
            opt("constraint"), f"invalid feature specification: partition {capacity.name} has no {' or '.join(wanted)} "
            f"(features there: {known}).", fallback="constraint",
        )  # fmt: skip


def _check_against(capacity: PartitionCapacity, request: ScriptRequest, errors: _Errors, script_options: dict) -> dict | None:
    """The partition's limits in Slurm's terms (each refusal names the directive); the numbers
    Slurm will allocate."""
    opt = request.options.get
    gpu_type = request.gpu_type
    eligible = capacity.eligible_nodes(gpu_type)
    if gpu_type and not eligible:
        known = ", ".join(capacity.gpu_types) or "none"
        source = opt("gres") or opt("gpus") or opt("gpus-per-node") or opt("gpus-per-task")
        errors.directive(source, f"no {gpu_type} GPUs in partition {capacity.name} (types there: {known}).", fallback="gpu_type", field="gpu_type")
        return None
    if not eligible:
        errors.add("partition", f"Partition {capacity.name} has no GPUs.")
        return None
    per_node_gpus = max(n.gpus_total for n in eligible)
    cpus_per_node = max((n.cpus_total for n in eligible), default=0)
    mem_per_node_mb = max((n.memory_mb for n in eligible), default=0)
    nodes = request.nodes_for(cpus_per_node)
    if nodes > len(eligible):
        errors.directive(opt("nodes") or opt("ntasks"), f"partition {capacity.name} has {len(eligible)} node(s) with {gpu_type or 'GPUs'}.", fallback="nodes")
        return None
    gpus = request.gpus_total(nodes=nodes, gpus_per_node=per_node_gpus)
    if not gpus:
        errors.add("gpus", "Ask for GPUs: give gpus, or a GPU directive in the script (--gres=gpu:N, --gpus, --gpus-per-node, --gpus-per-task).")
        return None
    if -(-gpus // nodes) > per_node_gpus:
        source = opt("gres") or opt("gpus") or opt("gpus-per-node") or opt("gpus-per-task")
        errors.directive(
            source, f"at most {per_node_gpus * nodes} {gpu_type or 'GPUs'} on {nodes} node(s) of partition {capacity.name} "
            f"({per_node_gpus} per node).", fallback="gpus",
        )  # fmt: skip
    tasks = request.tasks(nodes)
    cpus_needed = 0
    if request.cpus_per_gpu:
        cpus_needed = request.cpus_per_gpu * -(-gpus // nodes)
    elif request.cpus_per_task:
        cpus_needed = request.cpus_per_task * -(-tasks // nodes)
    else:
        cpus_needed = -(-tasks // nodes)
    if cpus_per_node and cpus_needed > cpus_per_node and not request.exclusive:
        source = opt("cpus-per-gpu") or opt("cpus-per-task") or opt("ntasks") or opt("ntasks-per-node")
        errors.directive(source, f"{cpus_needed} CPUs per node requested; the nodes of partition {capacity.name} have {cpus_per_node}.", fallback="cpus_per_gpu")
    if request.mem_mb and mem_per_node_mb and request.mem_mb > mem_per_node_mb:
        errors.directive(opt("mem"), f"at most {mem_per_node_mb // 1024} GB per node in partition {capacity.name}.", fallback="memory_gb")
    if request.mem_per_cpu_mb and mem_per_node_mb and request.mem_per_cpu_mb * max(cpus_needed, 1) > mem_per_node_mb:
        errors.directive(opt("mem-per-cpu"), f"{request.mem_per_cpu_mb} MB per CPU × {cpus_needed} CPUs exceeds a node's {mem_per_node_mb} MB.")
    if request.mem_per_gpu_mb and mem_per_node_mb and request.mem_per_gpu_mb * -(-gpus // nodes) > mem_per_node_mb:
        errors.directive(opt("mem-per-gpu"), f"{request.mem_per_gpu_mb} MB per GPU exceeds a node's {mem_per_node_mb} MB.")
    time_n = request.time_limit_minutes
    if request.time_unlimited:
        if capacity.max_time_minutes is None:
            errors.directive(opt("time"), "give a finite time limit (the portal estimates the cost from it).", fallback="time_limit_minutes")
        else:
            errors.directive(opt("time"), f"requested time limit is invalid: at most {capacity.max_time_minutes} minutes in partition {capacity.name}.", fallback="time_limit_minutes")
        return None
    if time_n is None:
        time_n = capacity.default_time_minutes or capacity.max_time_minutes or 60
    elif capacity.max_time_minutes is not None and time_n > capacity.max_time_minutes:
        errors.directive(opt("time"), f"at most {capacity.max_time_minutes} minutes in partition {capacity.name}.", fallback="time_limit_minutes")
    if errors:
        return None
    memory_gb = None
    if request.mem_mb:
        memory_gb = -(-request.mem_mb // 1024)
    return {
        "partition": capacity.name, "gpu_type": gpu_type, "gpus": gpus, "nodes": nodes,
        "cpus_per_gpu": request.cpus_per_gpu, "memory_gb": memory_gb, "time_limit_minutes": time_n,
        "capacity": capacity, "ntasks": tasks, "cpus_per_task": request.cpus_per_task,
        "exclusive": request.exclusive, "array": request.array, "array_tasks": request.array_tasks,
        "array_throttle": request.array_throttle, "qos": request.qos or "", "constraint": request.constraint or "",
    }  # fmt: skip


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
}  # fmt: skip


def directives_table(script: str) -> tuple[list[dict], str]:
    """The script's directives for the form (line, as written, option, what it sets), or an error
    naming the line. Pure: no inventory (the estimate checks the rest)."""
    try:
        directives = parse_directives((script or "").replace("\r\n", "\n"))
        request = script_request(directives)
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
