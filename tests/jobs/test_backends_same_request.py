"""Both gateway backends submit the same effective request (issue 13, item 8).

Every script of tests/jobs/sbatch_corpus/ that sbatch accepts (``NN-*``) goes through the portal
(``job_submit`` → the relay's submission (the job's stored request), with ``--hold`` added) and is then submitted held twice to
the local Slurm 25.11 cluster: by the cli backend (sbatch reads the script's ``#SBATCH`` lines) and
by the pyslurm backend (which builds its JobSubmitDescription from the portal's parse of them,
portal.slurm.pyslurm_request). Slurm's own view of both (``scontrol show job -o``) must agree on
everything the job asks for. Both jobs are cancelled at the end.

A few scripts ask for what pyslurm 25.11 cannot express (``FALLBACK``): the pyslurm gateway submits
those with the cli backend; the test proves both that they are exactly those scripts and that the
request Slurm got is still the same.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from jobs import services
from jobs.services import job_submit
from portal.slurm.cli import CliGateway, _clean_env
from portal.slurm.pyslurm import PyslurmGateway
from portal.slurm.pyslurm_request import NotExpressible, description_kwargs
from tests.jobs.test_sbatch_oracle import COMPARED
from tests.support import use_slurm_target, with_options

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]

CORPUS = Path(__file__).parent / "sbatch_corpus"
ACCEPTED = sorted(p for p in CORPUS.glob("*.sbatch") if p.stem[0].isdigit())
RELEASE = "25.11"

# What pyslurm cannot submit as sbatch would (pyslurm_request's docstring): the cli backend does.
FALLBACK = {
    "10-mem-zero-whole-node": "mem",  # --mem=0
    "31-dependency-begin-nice": "begin",  # --begin=now+1hour
    "35-distribution-hint": "hint",
    "08-cpus-per-gpu-mem-per-gpu": "mem-per-gpu",  # pyslurm 25.11.2's _set_memory raises NameError
    "34-ntasks-per-gpu": "ntasks-per-gpu",  # pyslurm's implicit gpu-bind: Slurm refuses the TRES
}

# The brief's fields besides the oracle's: the request, not who, when or where it was submitted.
FIELDS = (*COMPARED, "ReqTRES", "MinMemoryCPU", "Comment", "StdOut", "StdErr", "Priority", "Reservation",
          "UserId", "GroupId", "Dependency", "TimeMin")  # fmt: skip


@pytest.fixture
def cluster25(request, settings):
    """The fixture world on the Slurm 25.11 cluster (inventory synced, teams mirrored)."""
    use_slurm_target(settings, "cli", RELEASE)
    return request.getfixturevalue("cluster")


@pytest.fixture
def backends(settings, cluster25):
    """(cli, pyslurm) gateways on the 25.11 cluster, and the environment its scontrol needs."""
    use_slurm_target(settings, "pyslurm", RELEASE)  # skips (fails under CI) without pyslurm
    common = {"cluster": settings.SLURM_CLUSTER, "timeout": settings.SLURM_TIMEOUT, "slurm_conf": settings.SLURM_CONF}
    cli = CliGateway(**common, bin_dir=settings.SLURM_BIN_DIR)
    pyslurm = PyslurmGateway(**common, bin_dir=settings.SLURM_BIN_DIR)
    env = _clean_env(settings.SLURM_CONF)
    scontrol = str(Path(settings.SLURM_BIN_DIR) / "scontrol") if settings.SLURM_BIN_DIR else "scontrol"
    return cli, pyslurm, env, scontrol


@pytest.fixture
def held(backends):
    ids: list[int] = []
    yield ids
    cli = backends[0]
    for job_id in ids:
        cli.cancel(job_id)


def _show(scontrol: str, env: dict, job_id: int) -> dict[str, str]:
    done = subprocess.run([scontrol, "show", "job", "-o", str(job_id)], capture_output=True, text=True, env=env, check=True)
    first = done.stdout.splitlines()[0]  # a pending array is one record
    return dict(re.findall(r"(?:^|\s)([A-Za-z/:]+)=(\S*)", first))


def _normalise(record: dict[str, str], job_id: int) -> None:
    """Where scontrol prints one request two ways, one way; nothing else.

    - StdOut/StdErr: the job's own id where the pattern said %j/%A;
    - NumNodes "N-N" is "N": a minimum and maximum of N nodes (pyslurm always sends both; sbatch's
      job shows only the minimum when they are equal);
    - TresPerTask "cpu=C": sbatch 25.11 repeats --cpus-per-task there, pyslurm cannot set it (its
      tres_per_task holds GPUs only); CPUs/Task, compared, carries C for both;
    - TRES per task/node/job "gres/gpu:N" is "gres/gpu=N": the same count in the form pyslurm sends
      (gres:gpu:N) and the one sbatch 25.11 sends."""
    for key in ("StdOut", "StdErr"):
        record[key] = record.get(key, "").replace(str(job_id), "ID")
    low, _, high = record.get("NumNodes", "").partition("-")
    if high == low:
        record["NumNodes"] = low
    for key in ("TresPerTask", "TresPerNode", "TresPerJob", "TresPerSocket"):
        if key in record:
            record[key] = re.sub(r"(gres/gpu(?::[^:,=]+)?):(\d+)", r"\1=\2", record[key])
    if "TresPerTask" in record:
        items = [item for item in record["TresPerTask"].split(",") if item != f"cpu={record.get('CPUs/Task')}"]
        record["TresPerTask"] = ",".join(items)
        if not items:
            del record["TresPerTask"]


@pytest.mark.parametrize("path", ACCEPTED, ids=[p.stem for p in ACCEPTED])
def test_cli_and_pyslurm_ask_slurm_for_the_same(cluster25, relays, backends, held, path):
    cli, pyslurm, env, scontrol = backends
    job, _ = job_submit(user=cluster25.alice, team=cluster25.vision, script=path.read_text())
    spec = services._submission_for(job)
    spec = with_options(spec, ("hold", None))

    if path.stem in FALLBACK:
        with pytest.raises(NotExpressible) as refused:
            description_kwargs(spec)
        assert refused.value.option == FALLBACK[path.stem]
    else:
        assert description_kwargs(spec)["priority"] == 0  # held, through pyslurm itself

    by_cli = cli.submit(spec)
    held.append(by_cli)
    by_pyslurm = pyslurm.submit(spec)
    held.append(by_pyslurm)

    direct, indirect = _show(scontrol, env, by_cli), _show(scontrol, env, by_pyslurm)
    assert direct["JobState"] == indirect["JobState"] == "PENDING"
    assert direct["Reason"] == indirect["Reason"] == "JobHeldUser"
    for record, job_id in ((direct, by_cli), (indirect, by_pyslurm)):
        _normalise(record, job_id)
    differences = {key: (direct.get(key), indirect.get(key)) for key in FIELDS if direct.get(key) != indirect.get(key)}
    assert not differences, f"{path.name}: cli vs pyslurm {differences}"
    assert direct["Comment"] == dict(spec.request.command_line)["comment"]


def test_every_option_form_of_the_corpus_is_compared():
    """The accepted corpus covers the options the brief names (so the test above compares them)."""
    text = "\n".join(p.read_text() for p in ACCEPTED)
    for option in ("--ntasks", "--gres", "--gpus=", "--gpus-per-node", "--gpus-per-task", "--cpus-per-task",
                   "--cpus-per-gpu", "--mem=", "--mem-per-cpu", "--exclusive", "--array", "%", "--qos",
                   "--signal", "--requeue", "--no-requeue", "--mail-type", "--output", "--error", "--time",
                   "--account", "-D", "-p"):  # fmt: skip
        assert option in text, option
