"""A job against what its partition and its cluster allow, in Slurm's words (each refusal names
the directive): the cluster's policy (QOS, node features, MaxArraySize) and the partition's limits
(GPUs, nodes, CPUs, memory, time), and the numbers Slurm will allocate (jobs.spec)."""

from __future__ import annotations

import dataclasses

from django.conf import settings

from gpuportal_sbatch.directives import Directive, ScriptRequest, release_problems
from gpuportal_sbatch.directives import memory_gb as memory_gb_of
from jobs.constraints import unmatched
from jobs.inventory import PartitionCapacity
from jobs.spec_fields import _Errors
from portal.models import ClusterPolicyInfo
from portal.slurm.kube_job import image_refusal
from portal.slurm.kube_job import refusal as kubernetes_refusal
from portal.slurm.kube_job import script_refusal as kubernetes_script_refusal


def _check_release(directives: list[Directive], capacity: PartitionCapacity, errors: _Errors) -> None:
    """The script's directives (read before the cluster was known: any release's options) against
    the sbatch of the cluster's Slurm release: an option that release lacks is refused naming it
    ("sbatch of Slurm 22.05 has no option --tres-per-task (25.11 has it)"). A release the table does
    not have (or not read yet): nothing more to check."""
    for directive, problem in release_problems(directives, capacity.slurm_release):
        errors.directive(directive, problem.message)


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


def _check_against(capacity: PartitionCapacity, request: ScriptRequest, errors: _Errors) -> dict | None:
    """The partition's limits in Slurm's terms (each refusal names the directive); the numbers
    Slurm will allocate."""
    opt = request.options.get
    if capacity.exclusive and not request.exclusive:
        # OverSubscribe=EXCLUSIVE: Slurm gives every job of the partition whole nodes (AllocTRES: every GPU)
        request = dataclasses.replace(request, exclusive=True)
    eligible = _eligible_nodes(capacity, request, errors)
    if not eligible:
        return None
    per_node_gpus, cpus_per_node, mem_per_node_mb = _node_size(capacity, eligible)
    allocated = _nodes_and_gpus(capacity, request, errors, eligible=eligible, per_node_gpus=per_node_gpus,
                                cpus_per_node=cpus_per_node)  # fmt: skip
    if allocated is None:
        return None
    nodes, gpus = allocated
    tasks = request.tasks(nodes)
    cpus_needed = _cpus_needed(request, gpus=gpus, tasks=tasks, nodes=nodes)
    if cpus_per_node and cpus_needed > cpus_per_node and not request.exclusive:
        source = opt("cpus-per-gpu") or opt("cpus-per-task") or opt("ntasks") or opt("ntasks-per-node")
        errors.directive(source, f"{cpus_needed} CPUs per node requested; the nodes of partition {capacity.name} have {cpus_per_node}.", fallback="cpus_per_gpu")
    _check_memory(capacity, request, errors, gpus_per_node=-(-gpus // nodes), cpus_needed=cpus_needed, mem_per_node_mb=mem_per_node_mb)
    time_n = _time_limit(capacity, request, errors)
    if time_n is None or errors:
        return None
    memory_gb = memory_gb_of(request.mem_mb) if request.mem_mb else None
    return {
        "partition": capacity.name, "gpu_type": request.gpu_type, "gpus": gpus, "nodes": nodes,
        "cpus_per_gpu": request.cpus_per_gpu, "memory_gb": memory_gb, "time_limit_minutes": time_n,
        "capacity": capacity, "ntasks": tasks, "cpus_per_task": request.cpus_per_task,
        "exclusive": request.exclusive, "array": request.array, "array_tasks": request.array_tasks,
        "array_throttle": request.array_throttle, "qos": request.qos or "", "constraint": request.constraint or "",
    }  # fmt: skip


# ---------------------------------------------------------------- _check_against's steps


def _gpu_directive(request: ScriptRequest) -> Directive | None:
    """The directive that asks for GPUs (the script's or a field's), the one a refusal about them names."""
    opt = request.options.get
    return opt("gres") or opt("gpus") or opt("gpus-per-node") or opt("gpus-per-task")


def _eligible_nodes(capacity: PartitionCapacity, request: ScriptRequest, errors: _Errors) -> list:
    """The partition's nodes the job may run on (those with its GPU type, or with any GPU); none: the
    refusal is added."""
    eligible = capacity.eligible_nodes(request.gpu_type)
    if request.gpu_type and not eligible:
        known = ", ".join(capacity.gpu_types) or "none"
        errors.directive(_gpu_directive(request), f"no {request.gpu_type} GPUs in partition {capacity.name} (types there: {known}).",
                         fallback="gpu_type", field="gpu_type")  # fmt: skip
    elif not eligible:
        errors.add("partition", f"Partition {capacity.name} has no GPUs.")
    return eligible


def _node_size(capacity: PartitionCapacity, eligible: list) -> tuple[int, int, int]:
    """The most GPUs, CPUs and memory (MB) a job may have of one eligible node: (GPUs, CPUs, MB)."""
    per_node_gpus = max(n.gpus_total for n in eligible)
    cpus_per_node = max((n.cpus_total for n in eligible), default=0)
    mem_per_node_mb = max((n.memory_mb for n in eligible), default=0)
    if capacity.max_mem_per_node_mb:  # the partition's MaxMemPerNode caps what a job may have of a node
        mem_per_node_mb = min(mem_per_node_mb or capacity.max_mem_per_node_mb, capacity.max_mem_per_node_mb)
    return per_node_gpus, cpus_per_node, mem_per_node_mb


def _nodes_and_gpus(capacity: PartitionCapacity, request: ScriptRequest, errors: _Errors, *, eligible: list,
                    per_node_gpus: int, cpus_per_node: int) -> tuple[int, int] | None:  # fmt: skip
    """The nodes and GPUs (in all) Slurm will allocate, checked against the eligible nodes; None when
    the job cannot be placed at all (more nodes than there are, no GPU asked for)."""
    opt = request.options.get
    gpu_type = request.gpu_type
    nodes = request.nodes_for(cpus_per_node)
    if nodes > len(eligible):
        errors.directive(opt("nodes") or opt("ntasks"), f"partition {capacity.name} has {len(eligible)} node(s) with {gpu_type or 'GPUs'}.", fallback="nodes")
        return None
    gpus = request.gpus_total(nodes=nodes, gpus_per_node=per_node_gpus)
    if not gpus:
        errors.add("gpus", "Ask for GPUs: give gpus, or a GPU directive in the script (--gres=gpu:N, --gpus, --gpus-per-node, --gpus-per-task).")
        return None
    if -(-gpus // nodes) > per_node_gpus:
        errors.directive(
            _gpu_directive(request), f"at most {per_node_gpus * nodes} {gpu_type or 'GPUs'} on {nodes} node(s) of partition "
            f"{capacity.name} ({per_node_gpus} per node).", fallback="gpus",
        )  # fmt: skip
    return nodes, gpus


def _cpus_needed(request: ScriptRequest, *, gpus: int, tasks: int, nodes: int) -> int:
    """The CPUs the job needs on each node: per GPU, else per task, else one per task."""
    if request.cpus_per_gpu:
        return request.cpus_per_gpu * -(-gpus // nodes)
    if request.cpus_per_task:
        return request.cpus_per_task * -(-tasks // nodes)
    return -(-tasks // nodes)


def _check_memory(capacity: PartitionCapacity, request: ScriptRequest, errors: _Errors, *, gpus_per_node: int,
                  cpus_needed: int, mem_per_node_mb: int) -> None:  # fmt: skip
    """The memory asked for (--mem, --mem-per-cpu, --mem-per-gpu, or the partition's DefMemPerGPU when
    none is) against what a job may have of a node."""
    opt = request.options.get
    if request.mem_mb and mem_per_node_mb and request.mem_mb > mem_per_node_mb:
        errors.directive(opt("mem"), f"at most {memory_gb_of(mem_per_node_mb, up=False)} GB per node in partition {capacity.name}.", fallback="memory_gb")
    if request.mem_per_cpu_mb and mem_per_node_mb and request.mem_per_cpu_mb * max(cpus_needed, 1) > mem_per_node_mb:
        errors.directive(opt("mem-per-cpu"), f"{request.mem_per_cpu_mb} MB per CPU × {cpus_needed} CPUs exceeds a node's {mem_per_node_mb} MB.")
    if request.mem_per_gpu_mb and mem_per_node_mb and request.mem_per_gpu_mb * gpus_per_node > mem_per_node_mb:
        errors.directive(opt("mem-per-gpu"), f"{request.mem_per_gpu_mb} MB per GPU exceeds a node's {mem_per_node_mb} MB.")
    asked_memory = request.mem_mb or request.mem_per_cpu_mb or request.mem_per_gpu_mb
    if not asked_memory and capacity.def_mem_per_gpu_mb and mem_per_node_mb:
        default_mb = capacity.def_mem_per_gpu_mb * gpus_per_node  # the partition's DefMemPerGPU applies
        if default_mb > mem_per_node_mb:
            errors.add("memory_gb", f"Memory specification can not be satisfied: partition {capacity.name} gives "
                       f"{capacity.def_mem_per_gpu_mb} MB per GPU by default ({default_mb} MB per node); a node has "
                       f"{mem_per_node_mb} MB. Ask for less memory (--mem).")  # fmt: skip


def _time_limit(capacity: PartitionCapacity, request: ScriptRequest, errors: _Errors) -> int | None:
    """The job's time limit in minutes (none given: the partition's default, else its maximum, else
    60), checked against the partition's; None, refused, when the portal cannot bound the job's time
    (a job asking for no limit, or a cluster that lets jobs overrun without bound)."""
    opt = request.options.get
    if request.time_unlimited:
        if capacity.max_time_minutes is None:
            errors.directive(opt("time"), "give a finite time limit (the portal estimates the cost from it).", fallback="time_limit_minutes")
        else:
            errors.directive(opt("time"), f"requested time limit is invalid: at most {capacity.max_time_minutes} minutes in partition {capacity.name}.", fallback="time_limit_minutes")
        return None
    if capacity.overrun_seconds is None:
        errors.directive(opt("time"), f"cluster {capacity.cluster or 'here'} lets jobs of partition {capacity.name} run past "
                         "their time limit without bound (OverTimeLimit=UNLIMITED): the portal cannot hold a budget for "
                         "them.", fallback="time_limit_minutes")  # fmt: skip
        return None
    time_n = request.time_limit_minutes
    if time_n is None:
        return capacity.default_time_minutes or capacity.max_time_minutes or 60
    if capacity.max_time_minutes is not None and time_n > capacity.max_time_minutes:
        errors.directive(opt("time"), f"at most {capacity.max_time_minutes} minutes in partition {capacity.name}.", fallback="time_limit_minutes")
    return time_n


def check_kubernetes(capacity: PartitionCapacity, effective: list[Directive], script: str, errors: _Errors) -> None:
    """On a Kubernetes cluster (issue 41), at submission: every option of the merged request a
    batch/v1 Job cannot express (several nodes, a reservation, an array, a QOS, …) is refused naming
    its directive (or field) and why, and so is an ``srun`` step in the script — nothing that could
    only be refused later reaches the API server. The rule is the translator's
    (portal.slurm.kube_job.refusal); a Slurm cluster: nothing to do."""
    row = capacity.cluster_row
    if row is None or row.kind != "kubernetes":
        return
    where = f"Kubernetes cluster {capacity.cluster!r}"
    for directive in effective:
        why = kubernetes_refusal(directive.option, directive.value)
        if why is not None:
            errors.directive(directive, f"--{directive.option} cannot run on {where}: {why}.")
    found = kubernetes_script_refusal(script)
    if found is not None:
        errors.add("script", f"Line {found[0]}: {found[1]} ({where}).")


def check_image(capacity: PartitionCapacity, image: str | None, errors: _Errors) -> str:
    """The job's ``image`` field: on a Kubernetes cluster the site's default or one it allows
    (portal.slurm.kube_job.image_refusal), on a Slurm cluster none (Slurm runs no images). Returns
    it stripped; a refusal is an error naming ``image``."""
    image = (image or "").strip()
    if not image:
        return ""
    row = capacity.cluster_row
    if row is None or row.kind != "kubernetes":
        errors.add("image", f"Cluster {capacity.cluster!r} runs Slurm, which runs no container images: leave the image empty.")
        return image
    why = image_refusal(image, default=settings.GPUPORTAL_K8S_IMAGE, allowed=settings.GPUPORTAL_K8S_IMAGES)
    if why is not None:
        errors.add("image", f"{why[0].upper()}{why[1:]}.")
    return image
