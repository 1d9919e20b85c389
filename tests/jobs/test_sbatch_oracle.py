"""Differential tests against the oracle nobody here wrote: Debian's sbatch 22.05.

Every script of tests/jobs/sbatch_corpus/ is submitted held (``--hold``) twice to the local cluster:
directly with sbatch (as alice, in account vision, from her default directory (JOB_DEFAULT_WORKDIR), the
script on stdin) and through the portal (``job_submit`` → the relay's submission (the job's stored request) → the gateway, with
``--hold`` added). Slurm's own view of both (``scontrol show job``) must agree on what is asked:
ReqTRES, time limit, node and task counts, array range, memory, CPUs per task, partition, QOS, …
Both are cancelled at the end (other engineers share the cluster; every job is tagged).

- ``NN-*``: sbatch accepts them; the portal must too, and ask for the same.
- ``rNN-*``: sbatch refuses them; the portal must refuse them too, before Slurm (a 400 naming the
  line or field; QOS, node features and MaxArraySize as the inventory sync read them, in the words
  of sbatch's refusal).
- ``pNN-*``: sbatch accepts them held, but they can never run here (more GPUs, CPUs or memory than a
  node has, an unknown GPU type) or name another team's account: the portal refuses them before Slurm.
"""

from __future__ import annotations

import os
import re
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings

from jobs import services
from jobs.services import job_submit
from portal.exceptions import ApplicationError
from portal.slurm import SlurmRejected, get_gateway
from portal.slurm.cli import _clean_env
from tests.support import with_options

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]

CORPUS = Path(__file__).parent / "sbatch_corpus"
SCRIPTS = sorted(CORPUS.glob("*.sbatch"))
ORACLE_TAG = "gpuportal-test:sbatch-oracle"
# sbatch's reasons the portal repeats (after "Batch job submission failed: ")
SLURM_REASONS = ("Invalid qos specification", "Invalid feature specification", "Invalid job array specification")

# scontrol show job fields that say what the job asks for (not who, when or where it was submitted)
COMPARED = (
    "TRES", "TimeLimit", "NumNodes", "NumTasks", "NumCPUs", "CPUs/Task", "ArrayTaskId", "MinMemoryNode",
    "MinMemoryCPU", "MinCPUsNode", "Partition", "QOS", "Features", "OverSubscribe", "Requeue", "MailType",
    "MailUser", "JobName", "ExcNodeList", "ReqNodeList", "Nice", "TresPerNode", "TresPerTask", "TresPerJob",
    "CpusPerTres", "MemPerTres", "NtasksPerTRES", "Contiguous", "Account", "WorkDir",
)  # fmt: skip


def _env() -> dict:
    return _clean_env(settings.SLURM_CONF)


def _show(job_id: int) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], capture_output=True, text=True, env=_env(), check=True).stdout
    first = out.splitlines()[0]  # a pending array is one record
    return dict(re.findall(r"(?:^|\s)([A-Za-z/:]+)=(\S*)", first))


def _oracle(script: str) -> tuple[int | None, str]:
    """sbatch --hold as alice (the script on stdin, as the portal sends it): (job id, message)."""
    argv = ["sbatch", "--hold", "--parsable", "--export=NONE", "--uid=alice", "--gid=alice", "--account=vision",
            f"--comment={ORACLE_TAG}"]  # fmt: skip
    # from alice's default directory (JOB_DEFAULT_WORKDIR, {home}), where the portal submits her jobs from
    cwd = settings.JOB_DEFAULT_WORKDIR.format(user="alice", home=os.path.expanduser("~alice"), team="vision", job="")
    done = subprocess.run(argv, input=script, capture_output=True, text=True, env=_env(), cwd=cwd)
    if done.returncode == 0:
        return int(done.stdout.strip().split(";")[0]), ""
    return None, (done.stderr.strip().splitlines() or [""])[-1]


def _through_portal(cluster, script: str) -> tuple[int | None, str, object]:
    """job_submit, then the relay's submission (the job's stored request) with --hold through the gateway: (job id, message, job)."""
    try:
        job, _ = job_submit(user=cluster.alice, team=cluster.vision, script=script)
    except ApplicationError as exc:
        return None, f"400 {exc.errors}", None
    spec = services._submission_for(job)
    spec = with_options(spec, ("hold", None))
    try:
        return get_gateway().submit(spec), "", job
    except SlurmRejected as exc:
        return None, f"slurm: {exc.message}", job


@pytest.fixture
def cleanup():
    ids: list[int] = []
    yield ids
    for job_id in ids:
        subprocess.run(["scancel", str(job_id)], env=_env(), capture_output=True)


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_portal_asks_slurm_for_what_sbatch_asks_for(cluster, relays, cleanup, path):
    script = path.read_text()
    oracle_id, oracle_message = _oracle(script)
    if oracle_id:
        cleanup.append(oracle_id)
    portal_id, portal_message, job = _through_portal(cluster, script)
    if portal_id:
        cleanup.append(portal_id)
    kind = path.stem[0]
    if kind == "r":
        assert oracle_id is None, f"sbatch accepted {path.name}"
        assert portal_id is None, f"the portal got {path.name} into Slurm; sbatch said: {oracle_message}"
        assert job is None, f"{path.name} reached the relay; Slurm said: {portal_message}"  # refused before Slurm
        assert "script" in portal_message or "time_limit_minutes" in portal_message or "partition" in portal_message, portal_message
        reason = oracle_message.rpartition("Batch job submission failed: ")[2]
        if reason in SLURM_REASONS:  # the refusals the inventory sync makes possible: in Slurm's words
            assert reason.lower() in portal_message.lower() and "line " in portal_message, (reason, portal_message)
        return
    if kind == "p":
        assert oracle_id is not None, f"sbatch refused {path.name}: {oracle_message}"
        assert job is None and portal_message.startswith("400 "), portal_message
        assert "line " in portal_message, portal_message  # names the directive's line
        return
    assert oracle_id is not None, f"sbatch refused {path.name}: {oracle_message}"
    assert portal_id is not None, f"the portal refused {path.name}: {portal_message}"
    direct, portal = _show(oracle_id), _show(portal_id)
    direct["WorkDir"] = os.path.normpath(direct["WorkDir"])  # sbatch keeps "-D ." as /tmp/.
    differences = {key: (direct.get(key), portal.get(key)) for key in COMPARED if direct.get(key) != portal.get(key)}
    assert not differences, f"{path.name}: sbatch vs portal {differences}"
    for key in ("StdOut", "StdErr"):  # where the script names the files, Slurm writes the same
        if re.search(r"^#SBATCH.*(--output|--error|-o |-e )", script, re.M):
            assert portal[key].replace(str(portal_id), "ID") == direct[key].replace(str(oracle_id), "ID"), key
    # the estimate covers what Slurm allocates: GPUs (every GPU of the node with --exclusive) × time × tasks
    gpus = int(re.search(r"gres/gpu=(\d+)", direct["TRES"]).group(1))
    if "--exclusive" in script:
        gpus = 4 * int(direct["NumNodes"].split("-")[-1])
    elif "-N 1-2" in script:
        gpus *= 2  # a node range holds its largest allocation
    tasks = _array_size(direct.get("ArrayTaskId", ""))
    minutes = _minutes(direct["TimeLimit"])
    # … plus, per task, what the cluster lets it run past its limit (jobs.inventory.overrun_seconds)
    assert job.estimated_gpu_seconds % (gpus * tasks) == 0, path.name
    overrun = job.estimated_gpu_seconds // (gpus * tasks) - minutes * 60
    assert 0 <= overrun <= 600, (path.name, overrun)
    assert (job.gpus, job.array_tasks) == (gpus, tasks)


def _array_size(text: str) -> int:
    if not text:
        return 1
    text = text.split("%")[0]
    count = 0
    for part in text.split(","):
        if "-" in part:
            span, _, step = part.partition(":")
            first, last = (int(x) for x in span.split("-"))
            count += len(range(first, last + 1, int(step or 1)))
        else:
            count += 1
    return count


def _minutes(text: str) -> int:
    days, _, rest = text.rpartition("-")
    h, m, s = (int(x) for x in rest.split(":"))
    return int(days or 0) * 1440 + h * 60 + m + (1 if s else 0)


def test_the_corpus_is_large_and_covers_every_kind():
    kinds = {p.stem[0] for p in SCRIPTS}
    assert len(SCRIPTS) >= 40 and {"r", "p"} <= kinds
