"""Native submission sends what sbatch sends (issue 16): the oracle is sbatch 22.05 itself.

Every script of tests/jobs/sbatch_corpus/ that sbatch accepts (``NN-*``) goes through the portal
(``job_submit`` → the relay's JobSpec, held) and is then submitted to the local Slurm 22.05 cluster
twice: by ``sbatch`` (the cli gateway) and by the native submitter (the same gateway with
``native=True``: portal.slurm.native_request's descriptor, sent by libslurm in the helper process).
Slurm's view of both (``scontrol show job -o``) must agree on everything the job asks for; the
scripts with an option native_request does not map (``SBATCH_ONLY``) must be exactly those, and are
submitted by sbatch. Then one job really runs both ways and the environments it ran with are
compared, variable by variable. Both gateways' refusals of the rejected corpus (``r*``, ``p*``) are
the same refusals.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from jobs import services
from jobs.services import job_submit
from portal.slurm import SlurmRejected
from portal.slurm.cli import CliGateway, _clean_env
from portal.slurm.native import built_release
from portal.slurm.pyslurm_request import NotExpressible
from tests.jobs.test_sbatch_oracle import COMPARED
from tests.support import skip_unless_ci, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]

CORPUS = Path(__file__).parent / "sbatch_corpus"
ACCEPTED = sorted(p for p in CORPUS.glob("*.sbatch") if p.stem[0].isdigit())

# What native_request does not map: sbatch submits these (the option each first stops at).
SBATCH_ONLY = {
    "06-gpus-per-task": "gpus-per-task",
    "07-ntasks-per-node-gpus-per-task": "gpus-per-task",
    "08-cpus-per-gpu-mem-per-gpu": "mem-per-gpu",
    "18-qos-signal-requeue-mail": "signal",
    "31-dependency-begin-nice": "begin",
    "34-ntasks-per-gpu": "ntasks-per-gpu",
    "35-distribution-hint": "distribution",
}

FIELDS = (*COMPARED, "ReqTRES", "MinMemoryCPU", "Comment", "StdOut", "StdErr", "StdIn", "Priority", "Reservation",
          "UserId", "GroupId", "Dependency", "TimeMin", "Command", "Shared", "Contiguous", "Licenses", "Network",
          "Power", "MinTmpDiskNode", "SubmitLine", "BatchFlag", "Reboot", "ExitCode", "OverSubscribe")  # fmt: skip


@pytest.fixture
def gateways(settings, cluster):
    """(sbatch, native) gateways on the 22.05 cluster, and scontrol's environment."""
    if built_release() is None:
        skip_unless_ci("the native module is not built (make native)")
    common = {"cluster": settings.SLURM_CLUSTER, "timeout": settings.SLURM_TIMEOUT, "slurm_conf": settings.SLURM_CONF,
              "bin_dir": settings.SLURM_BIN_DIR}  # fmt: skip
    sbatch, native = CliGateway(**common), CliGateway(**common, native=True)
    yield sbatch, native, _clean_env(settings.SLURM_CONF)
    native.native.close()


@pytest.fixture
def submitted(gateways):
    ids: list[int] = []
    yield ids
    for job_id in ids:
        gateways[0].cancel(job_id)


def _show(env: dict, job_id: int) -> dict[str, str]:
    done = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], capture_output=True, text=True, env=env, check=True)
    first = done.stdout.splitlines()[0]  # a pending array is one record
    return dict(re.findall(r"(?:^|\s)([A-Za-z/:]+)=(\S*)", first))


def _normalise(record: dict[str, str], job_id: int) -> dict[str, str]:
    for key in ("StdOut", "StdErr"):
        record[key] = record.get(key, "").replace(str(job_id), "ID")
    return record


def _held_spec(user, team, script: str):
    job, _ = job_submit(user=user, team=team, script=script)
    spec = services._spec_for(job)
    return replace(spec, options=(*spec.options, ("hold", None)))


# Options the corpus has no accepted script for (its scripts stay as other tests know them).
EXTRA = {
    "x1-contiguous-time-min-singleton": "#SBATCH --gres=gpu:1 --contiguous -t 10 --time-min=5 --dependency=singleton -J one\n",
    "x2-requeue-nice-input-mem-g": "#SBATCH --gres=gpu:a100:1 --requeue --nice=5 --input=/dev/null --mem=2G -t 3\n",
    "x3-oversubscribe-range-tasks": "#SBATCH --gres=gpu:1 --oversubscribe -N 1-2 -n 3 -c 2 -t 3\n",
    "x4-mem-per-cpu-append-relative": "#SBATCH --gres=gpu:1 --mem-per-cpu=512 --open-mode=append -e err/%x-%j.txt -t 3\n",
    "x5-gpus-per-node-ntasks-per-node": "#SBATCH --gpus-per-node=a100:2 -N 2 --ntasks-per-node=2 -t 3\n",
    "x6-cpus-per-gpu-mem": "#SBATCH --gres=gpu:h100:2 --cpus-per-gpu=4 --mem=8000 -t 3\n",
}
SCRIPTS = {**{p.stem: p.read_text() for p in ACCEPTED},
           **{name: f"#!/bin/bash\n{body}srun hostname\n" for name, body in EXTRA.items()}}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_sbatch_and_native_ask_slurm_for_the_same(cluster, relays, gateways, submitted, name):
    sbatch, native, env = gateways
    spec = _held_spec(cluster.alice, cluster.vision, SCRIPTS[name])
    try:
        native.native.descriptor(spec, script="#!/bin/bash\n", submit_line="sbatch")
    except NotExpressible as refused:
        assert refused.option == SBATCH_ONLY.get(name), f"{name}: native refuses --{refused.option}"
    else:
        assert name not in SBATCH_ONLY, f"{name}: expected to go through sbatch"

    by_sbatch = sbatch.submit(spec)
    submitted.append(by_sbatch)
    by_native = native.submit(spec)
    submitted.append(by_native)
    assert by_native != by_sbatch

    direct, indirect = _show(env, by_sbatch), _show(env, by_native)
    assert direct["JobState"] == indirect["JobState"] == "PENDING"
    assert direct["Reason"] == indirect["Reason"] == "JobHeldUser"
    direct, indirect = _normalise(direct, by_sbatch), _normalise(indirect, by_native)
    differences = {key: (direct.get(key), indirect.get(key)) for key in FIELDS if direct.get(key) != indirect.get(key)}
    assert not differences, f"{name}: sbatch vs native {differences}"
    assert direct["Comment"] == spec.comment


def test_the_scripts_cover_every_option_native_request_maps():
    """Each option native_request maps (its _apply) is in a script above that goes natively."""
    import inspect

    from portal.slurm import native_request

    mapped = set(re.findall(r'option (?:==|in) \(?"([a-z-]+)"', inspect.getsource(native_request._apply)))
    mapped |= {o for group in re.findall(r'option in \(([^)]*)\)', inspect.getsource(native_request._apply))
               for o in re.findall(r'"([a-z-]+)"', group)}  # fmt: skip
    from gpuportal_cli.sbatch_directives import parse_directives

    covered = {d.option for name, text in SCRIPTS.items() if name not in SBATCH_ONLY for d in parse_directives(text)}
    portal_sets = {"account", "partition", "comment", "reservation", "uid", "gid", "chdir", "job-name", "hold",
                   "output", "error"}  # spec_options / the portal's typed options: on every job above
    # constraint: no node of the local cluster has a feature; the rejected corpus (r18, r20, r21) has it
    assert mapped - portal_sets - covered == {"constraint"}


ENV_SCRIPT = "#!/bin/bash\n#SBATCH --gres=gpu:1 --time=2 --ntasks=2 --cpus-per-task=1 --mem=64 -J envdump\nenv -0 | sort -z | tr '\\0' '\\n'\n"
# What differs between any two jobs, whoever submitted them.
_PER_JOB = re.compile(r"^(SLURM_(JOB_ID|JOBID|TASK_PID|JOB_START_TIME|JOB_END_TIME|ARRAY_JOB_ID|JOB_UID|SCRIPT_CONTEXT|"
                      r"LAUNCH_NODE_IPADDR|JOB_NODELIST|NODELIST|TOPOLOGY_ADDR|NODEID|PROCID|LOCALID|JOB_CPUS_PER_NODE|"
                      r"CPUS_ON_NODE|TASKS_PER_NODE|NODENAME|STEP_.*|GTIDS|SRUN_COMM_.*)|_|SHLVL|OLDPWD)=")  # fmt: skip


def _ran(env: dict, job_id: int) -> None:
    def ended():
        state = _show(env, job_id).get("JobState")
        return state if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL") else None

    assert wait_for(ended, timeout=90, interval=0.3, what=f"job {job_id} to end") == "COMPLETED"


def test_a_job_runs_with_the_same_environment_both_ways(cluster, relays, gateways, submitted, tmp_path):
    sbatch, native, env = gateways
    job, _ = job_submit(user=cluster.alice, team=cluster.vision, script=ENV_SCRIPT)
    spec = services._spec_for(job)
    native.native.descriptor(spec, script="#!/bin/bash\n", submit_line="sbatch")  # natively expressible
    outputs = {}
    for name, gateway in (("sbatch", sbatch), ("native", native)):
        job_id = gateway.submit(spec)
        submitted.append(job_id)
        _ran(env, job_id)
        record = _show(env, job_id)
        path = Path(record["StdOut"])
        wait_for(lambda path=path: path.exists() or None, timeout=10, interval=0.1)
        lines = path.read_text().splitlines()
        outputs[name] = sorted(line.replace(str(job_id), "ID") for line in lines if "=" in line and not _PER_JOB.match(line))
    assert len(outputs["sbatch"]) > 20
    only_sbatch = set(outputs["sbatch"]) - set(outputs["native"])
    only_native = set(outputs["native"]) - set(outputs["sbatch"])
    assert not only_sbatch and not only_native, f"only with sbatch: {sorted(only_sbatch)}; only native: {sorted(only_native)}"


# What the portal lets through and only Slurm refuses (an account, partition or QOS it does not hold,
# more nodes than it has): Slurm's words reach the job both ways. For a partition sbatch 22.05 says
# one line more before them (its own "invalid partition specified: NAME"); the refusal is the same.
REFUSED = {
    "account": lambda spec: replace(spec, account="no_such_account"),
    "partition": lambda spec: replace(spec, options=(*spec.options, ("partition", "nosuchpart"))),
    "qos": lambda spec: replace(spec, options=(*spec.options, ("qos", "nosuchqos"))),
    "nodes": lambda spec: replace(spec, options=(*spec.options, ("nodes", "9"))),
    "constraint": lambda spec: replace(spec, options=(*spec.options, ("constraint", "nvlink"))),
}


@pytest.mark.parametrize("what", sorted(REFUSED))
def test_slurm_refuses_the_same_requests_both_ways(cluster, relays, gateways, submitted, what):
    sbatch, native, _ = gateways
    spec = REFUSED[what](_held_spec(cluster.alice, cluster.vision, "#!/bin/bash\n#SBATCH --gres=gpu:1 -t 5\ntrue\n"))
    native.native.descriptor(spec, script="#!/bin/bash\n", submit_line="sbatch")  # natively expressible
    refusals = []
    for gateway in (sbatch, native):
        with pytest.raises(SlurmRejected) as refused:
            submitted.append(gateway.submit(spec))
        refusals.append(refused.value.message)
    assert refusals[0].splitlines()[-1] == refusals[1]
    assert refusals[1].startswith("sbatch: error: Batch job submission failed: ")
    assert refusals[0] == refusals[1] or what == "partition"


def test_a_dead_helper_is_unavailable_then_replaced(cluster, relays, gateways, submitted):
    """A helper killed between jobs (or in one) costs one SlurmUnavailable at most, never a job twice:
    the next submit starts a new helper."""
    from portal.slurm import SlurmUnavailable

    _, native, _ = gateways
    spec = _held_spec(cluster.alice, cluster.vision, "#!/bin/bash\n#SBATCH --gres=gpu:1 -t 5\ntrue\n")
    submitted.append(native.submit(spec))
    helper = native.native._proc
    helper.kill()
    helper.wait()
    try:
        submitted.append(native.submit(spec))
    except SlurmUnavailable as exc:
        assert "helper ended" in exc.message
        submitted.append(native.submit(spec))
    assert native.native._proc.pid != helper.pid
    time.sleep(0)


def test_the_relay_sends_a_rounds_jobs_in_one_exchange_exactly_once(cluster, relays, gateways, submitted):
    """The batched relay gives a native gateway its round at once (submit_many: one exchange with
    the helper, RELAY_SUBMIT_MANY jobs at most); a job only sbatch can pass goes through sbatch in
    the same round; each job reaches Slurm once, under its own tag."""
    from jobs.models import Job
    from jobs.services import job_relay_batch_run
    from jobs.services.relay import RELAY_SUBMIT_MANY
    from portal.slurm import use_gateway
    from tests.support import CountingGateway

    _, native, env = gateways
    scripts = ["#!/bin/bash\n#SBATCH --gres=gpu:1 -t 5\ntrue\n"] * (RELAY_SUBMIT_MANY + 3)
    scripts.append("#!/bin/bash\n#SBATCH --gres=gpu:1 -t 5 --signal=B:USR1@30\ntrue\n")  # sbatch only
    ids = [job_submit(user=cluster.alice, team=cluster.vision, script=script)[0].pk for script in scripts]
    counting = CountingGateway(native)
    with use_gateway(counting):
        result = job_relay_batch_run(ids)
    jobs = list(Job.objects.filter(pk__in=ids))
    submitted.extend(job.slurm_job_id for job in jobs if job.slurm_job_id)
    assert result["submitted"] == len(ids) and result["submit_failed"] == 0
    assert counting.calls["submit_many"] == 2 and counting.calls["submit"] == 0
    assert len({job.slurm_job_id for job in jobs}) == len(ids)
    tags = [_show(env, job.slurm_job_id)["Comment"] for job in jobs]
    assert sorted(tags) == sorted(job.slurm_tag for job in jobs)


@pytest.mark.parametrize("script", ["/tmp/not-a-script.sh", "\n \n", "#!/bin/bash\r\ntrue\r\n"],
                         ids=["no-shebang", "whitespace", "dos-line-breaks"])  # fmt: skip
def test_sbatchs_own_checks_of_the_script_refuse_the_same_way(cluster, relays, gateways, submitted, script):
    """What sbatch refuses before it asks Slurm (sbatch.c _get_script_buffer): the same words."""
    sbatch, native, _ = gateways
    spec = replace(_held_spec(cluster.alice, cluster.vision, "#!/bin/bash\n#SBATCH --gres=gpu:1 -t 5\ntrue\n"),
                   script=script)  # fmt: skip
    refusals = []
    for gateway in (sbatch, native):
        with pytest.raises(SlurmRejected) as refused:
            submitted.append(gateway.submit(spec))
        refusals.append(refused.value.message)
    assert refusals[0] == refusals[1]
