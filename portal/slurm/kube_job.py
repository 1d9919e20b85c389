"""A job's request (``JobRequest``, built once at submission) as a Kubernetes ``batch/v1`` Job (issue 41).

The Kubernetes backend's translator, as ``cli_argv`` is sbatch's and ``pyslurm_request`` pyslurm's:
it reads the stored request and nothing else, and owns the one rule of what Kubernetes can express
(``refusal``), which the submission's validation applies to every option before anything reaches
the API server (``jobs.spec_policy.check_kubernetes``) and the translation applies again, as a
backstop, to what it is handed.

What the Job gets:

- ``metadata.name``: ``gpuportal-<the portal's job uuid>`` (from the request's tag): a create that is
  retried is answered 409 AlreadyExists and is the same Job, never a second one; the labels carry the
  tag's uuid and the job's number (``job_number``: what the portal records as the job's id there);
- the namespace: the team's account on the cluster (``--account``; the team's TeamClusterAccount);
- one pod (``parallelism``/``completions`` 1, ``backoffLimit`` 0, ``restartPolicy: Never``): a
  failed job is not run again, as Slurm's batch jobs are not requeued by the portal;
- an array job (``--array``): one such Job per task (Kubernetes 1.20 has no Indexed Jobs),
  ``gpuportal-<uuid>-<index>``, labelled with the index (``LABEL_TASK``) besides the job's uuid and
  number, its pod's environment carrying SLURM_ARRAY_JOB_ID (the job's number), SLURM_ARRAY_TASK_ID,
  _COUNT, _MIN, _MAX and _STEP as sbatch sets them; the task's own id (Slurm's %A of a task) is
  ``task_number``. A ``%N`` limit on the tasks running at once (``array_limit``) is the portal's to
  enforce: the submission creates the first N tasks' Jobs, the sync the next ones as earlier ones end
  (``jobs.arrays.array_tasks_to_start``), through the same create (``KubernetesGateway.array_tasks_start``);
- GPUs in ``limits["nvidia.com/gpu"]``, the type as the node selector ``gpu_type_label`` (the label
  GPU nodes carry), the time limit as ``activeDeadlineSeconds``, CPUs (``--cpus-per-task``,
  ``--cpus-per-gpu`` × GPUs) and memory (``--mem``, ``--mem-per-cpu``, ``--mem-per-gpu``) as
  requests, the job's environment, the submitter's uid/gid as ``securityContext`` runAsUser /
  runAsGroup, the image the request names (checked against the site's list at submission:
  ``image_refusal``) else the site's default, the working directory, and the script as the command (run by the
  interpreter its ``#!`` line names, ``/bin/sh`` without one; its ``#SBATCH`` lines are comments).
"""

from __future__ import annotations

import re
import shlex
import uuid

from .tags import tagged_job_id
from .types import JobRequest, JobSubmission, SlurmRejected

GPU_RESOURCE = "nvidia.com/gpu"
LABEL_JOB = "gpuportal.io/job"  # the portal's job uuid
LABEL_NUMBER = "gpuportal.io/job-number"  # job_number(uuid): the job's id as the portal records it
LABEL_TASK = "gpuportal.io/array-task"  # an array task's index (array jobs only)
LABEL_MANAGED = "gpuportal.io/managed-by"
MANAGED_BY = "gpuportal"
ANNOTATION_NAME = "gpuportal.io/job-name"
ANNOTATION_TAG = "gpuportal.io/tag"
CONTAINER = "job"

# Options a Kubernetes Job expresses (what each becomes: above); every other sbatch option is refused.
_MEANINGFUL = {
    "job-name", "account", "partition", "comment", "chdir", "output", "error", "open-mode", "time",
    "cpus-per-task", "cpus-per-gpu", "mem", "mem-per-cpu", "mem-per-gpu", "gres", "gpus", "gpus-per-node",
    "nodes", "ntasks", "ntasks-per-node", "export", "get-user-env", "uid", "gid", "array",
}  # fmt: skip
# Why some options are refused, in words; the others: no meaning for a Kubernetes Job.
_WHY = {
    "reservation": "a Slurm reservation has no counterpart on Kubernetes",
    "dependency": "dependencies between Kubernetes jobs are not supported yet",
    "qos": "a Slurm QOS has no counterpart on Kubernetes",
    "constraint": "node features are Slurm's; on Kubernetes the GPU type chooses the nodes",
    "exclusive": "a Kubernetes pod does not get its node to itself",
    "nodelist": "Kubernetes places the pod itself; name the GPU type instead",
    "exclude": "Kubernetes places the pod itself; name the GPU type instead",
    "begin": "a Kubernetes Job starts as soon as it is scheduled",
}
_SRUN = re.compile(r"^\s*(?:exec\s+|time\s+)?srun(?:\s|$)", re.MULTILINE)


def refusal(option: str, value: str | None) -> str | None:
    """Why a Kubernetes Job cannot express this sbatch option with this value (None: it can)."""
    if option in ("nodes",) and (value or "1").strip() not in ("1", "1-1"):
        return "several nodes: a Kubernetes Job's pod runs on one node"
    if option in ("ntasks", "ntasks-per-node") and (value or "1").strip() != "1":
        return "several tasks are started by srun, which Kubernetes does not have: one task per job"
    if option == "gres" and any(not item.removeprefix("gres:").startswith("gpu") for item in (value or "").split(",")):
        return "only GPUs are generic resources on Kubernetes (nvidia.com/gpu)"
    if option in ("mem", "mem-per-cpu", "mem-per-gpu") and re.fullmatch(r"0+[KMGT]?B?", (value or "").strip().upper()):
        return "0 (all of the node's memory) has no counterpart on Kubernetes: give an amount"
    if option == "array" and not array_indexes(value or ""):
        return f"not an array specification: {value!r}"
    if option in _MEANINGFUL:
        return None
    return _WHY.get(option, "an sbatch option with no meaning for a Kubernetes Job")


def image_refusal(image: str, *, default: str, allowed) -> str | None:
    """Why a job may not run in this image (None: it may): the site's default and the images it
    allows (GPUPORTAL_K8S_IMAGE, GPUPORTAL_K8S_IMAGES), compared as written in a pod spec."""
    if not image or image == default or image in allowed:
        return None
    listed = ", ".join([default, *[i for i in allowed if i != default]])
    return f"{image!r} is not an image this site allows (allowed: {listed})"


def script_refusal(script: str) -> tuple[int, str] | None:
    """The first line (1-based) that starts an ``srun`` step, and why it is refused; None when none does."""
    for number, line in enumerate(script.splitlines(), start=1):
        if not line.lstrip().startswith("#") and _SRUN.match(line):
            return number, "srun steps: Kubernetes has no srun; run the command directly"
    return None


def job_number(job_uuid: uuid.UUID) -> int:
    """The portal's job id as a number (the first 52 bits of its uuid): what the portal records as a
    Kubernetes job's id (``Job.slurm_job_id``), the same for every create of the same job."""
    return int(job_uuid.hex[:13], 16)


def job_name(job_uuid: uuid.UUID, index: int | None = None) -> str:
    return f"gpuportal-{job_uuid}" if index is None else f"gpuportal-{job_uuid}-{index}"


def task_number(number: int, index: int) -> int:
    """An array task's own id (what Slurm's %A is for a task; its usage record's job id): the job's
    number + 1 + the index, distinct from the job's and from its other tasks'."""
    return int(number) + 1 + int(index)


def array_indexes(value: str) -> list[int]:
    """The indexes of an ``--array`` value (sbatch's syntax: ``0-15``, ``1,3,5-7``, ``0-15:4``); [] when
    it is none."""
    from gpuportal_sbatch.directives import DirectiveError, parse_array

    try:
        return parse_array(value.strip())[0]
    except DirectiveError:
        return []


def array_limit(value: str) -> int | None:
    """The ``%N`` of an ``--array`` value: at most N of its tasks run at once (None: no limit)."""
    from gpuportal_sbatch.directives import DirectiveError, parse_array

    try:
        return parse_array(value.strip())[1] or None
    except DirectiveError:
        return None


def submission_uuid(request: JobRequest) -> uuid.UUID:
    """The portal job a request belongs to (its tag, ``--comment``)."""
    comment = next((value for option, value in reversed(request.options) if option == "comment"), "") or ""
    found = tagged_job_id(comment)
    if found is None:
        raise SlurmRejected("the request carries no portal tag: a Kubernetes job is named after it")
    return found


def job_manifest(submission: JobSubmission, *, image: str, gpu_type_label: str) -> tuple[str, dict]:
    """(namespace, the batch/v1 Job) for a submission that is not an array (job_manifests)."""
    namespace, bodies = job_manifests(submission, image=image, gpu_type_label=gpu_type_label)
    if len(bodies) != 1 or LABEL_TASK in bodies[0]["metadata"]["labels"]:
        raise SlurmRejected("an array job is several Kubernetes Jobs: job_manifests")
    return namespace, bodies[0]


def job_manifests(submission: JobSubmission, *, image: str, gpu_type_label: str) -> tuple[str, list[dict]]:
    """(namespace, the batch/v1 Jobs) for a submission: one, or one per task of an array. SlurmRejected
    when it cannot be expressed (the validation refuses such a request at submission; this is the backstop)."""
    request = submission.request
    refused = [f"--{o}: {why}" for o, v in request.options if (why := refusal(o, v))]
    if submission.reservation:
        refused.append(f"--reservation: {_WHY['reservation']}")
    if (line := script_refusal(request.script)) is not None:
        refused.append(f"line {line[0]}: {line[1]}")
    if refused:
        raise SlurmRejected("Kubernetes cannot run this job: " + "; ".join(refused))
    if not submission.uid:
        raise SlurmRejected("a Kubernetes job runs as its submitter's (non-root) Unix user: none is known")
    options = dict(request.options)  # the last of each option wins, as in sbatch
    namespace = options.get("account") or ""
    if not namespace:
        raise SlurmRejected("the job names no namespace (the team's account on the cluster)")
    job_uuid = submission_uuid(request)
    number = job_number(job_uuid)
    labels = {LABEL_MANAGED: MANAGED_BY, LABEL_JOB: str(job_uuid), LABEL_NUMBER: str(number)}
    indexes = array_indexes(options["array"]) if options.get("array") else []
    if not indexes:
        return namespace, [_manifest(request, options, submission, namespace, labels, job_name(job_uuid), [],
                                     image=image, gpu_type_label=gpu_type_label)]  # fmt: skip
    step = min((b - a for a, b in zip(indexes, indexes[1:])), default=1)
    array_env = [("SLURM_ARRAY_JOB_ID", str(number)), ("SLURM_ARRAY_TASK_COUNT", str(len(indexes))),
                 ("SLURM_ARRAY_TASK_MIN", str(indexes[0])), ("SLURM_ARRAY_TASK_MAX", str(indexes[-1])),
                 ("SLURM_ARRAY_TASK_STEP", str(step))]  # fmt: skip
    return namespace, [
        _manifest(request, options, submission, namespace, {**labels, LABEL_TASK: str(index)}, job_name(job_uuid, index),
                  [*array_env, ("SLURM_ARRAY_TASK_ID", str(index)), ("SLURM_JOB_ID", str(task_number(number, index)))],
                  image=image, gpu_type_label=gpu_type_label)  # fmt: skip
        for index in indexes
    ]


def _manifest(request: JobRequest, options: dict, submission: JobSubmission, namespace: str, labels: dict, name: str,
              extra_env: list, *, image: str, gpu_type_label: str) -> dict:
    container = _container(request, options, request.image or image)
    container["env"] += [{"name": key, "value": value} for key, value in extra_env]
    pod_spec: dict = {
        "restartPolicy": "Never",
        "securityContext": {"runAsUser": int(submission.uid), "runAsGroup": int(submission.gid or submission.uid)},
        "containers": [container],
    }
    if request.gpu_type:
        pod_spec["nodeSelector"] = {gpu_type_label: request.gpu_type}
    spec: dict = {"parallelism": 1, "completions": 1, "backoffLimit": 0,
                  "template": {"metadata": {"labels": labels}, "spec": pod_spec}}  # fmt: skip
    if request.time_limit_minutes:
        spec["activeDeadlineSeconds"] = request.time_limit_minutes * 60
    metadata = {"name": name, "namespace": namespace, "labels": labels,
                "annotations": {ANNOTATION_NAME: request.name, ANNOTATION_TAG: options.get("comment") or ""}}  # fmt: skip
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}


def _container(request: JobRequest, options: dict, image: str) -> dict:
    resources: dict = {"requests": {}, "limits": {}}
    if request.gpus:
        resources["limits"][GPU_RESOURCE] = str(request.gpus)
    cpus = _cpus(options, request.gpus)
    if cpus:
        resources["requests"]["cpu"] = str(cpus)
    memory = _memory_mib(options, cpus or 1, request.gpus)
    if memory:
        resources["requests"]["memory"] = f"{memory}Mi"
    env = [{"name": name, "value": value} for name, value in request.environment]
    return {
        "name": CONTAINER,
        "image": image,
        "command": [*_interpreter(request.script), "-c", request.script],
        "workingDir": request.workdir,
        "env": env,
        "resources": {key: value for key, value in resources.items() if value},
    }


def _interpreter(script: str) -> list[str]:
    """The script's ``#!`` line as argv (``/bin/sh`` without one)."""
    first = script.split("\n", 1)[0]
    if first.startswith("#!") and first[2:].strip():
        return shlex.split(first[2:].strip())
    return ["/bin/sh"]


def _cpus(options: dict, gpus: int) -> int:
    if options.get("cpus-per-gpu"):
        return _number("cpus-per-gpu", options["cpus-per-gpu"]) * max(gpus, 1)
    if options.get("cpus-per-task"):
        return _number("cpus-per-task", options["cpus-per-task"])
    return 0


def _memory_mib(options: dict, cpus: int, gpus: int) -> int:
    """The memory request in MiB: --mem, else --mem-per-gpu × GPUs, else --mem-per-cpu × CPUs."""
    for option, times in (("mem", 1), ("mem-per-gpu", max(gpus, 1)), ("mem-per-cpu", cpus)):
        if options.get(option):
            return _mib(option, options[option]) * times
    return 0


def _number(option: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise SlurmRejected(f"--{option}: not a number: {value!r}") from None


_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def _mib(option: str, value: str) -> int:
    """sbatch's memory sizes ("4096", "4G", "512M"; MiB without a unit) in MiB, rounded up."""
    match = re.fullmatch(r"([0-9]+)([KMGT]?)B?", value.strip().upper())
    if not match:
        raise SlurmRejected(f"--{option}: not a memory size: {value!r}")
    amount = int(match.group(1)) * _UNITS[match.group(2) or "M"]
    return max(1, int(-(-amount // 1)))
