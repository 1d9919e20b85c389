"""portal.slurm.pyslurm_request: the effective request (script directives + the portal's options) as
pyslurm's JobSubmitDescription attributes. Pure; what Slurm makes of them is proven against the real
Slurm 25.11 cluster by tests/jobs/test_backends_same_request.py (cli and pyslurm ask for the same)."""

from __future__ import annotations

import signal

import pytest

from portal.slurm.pyslurm_request import NotExpressible, description_kwargs
from portal.slurm.types import JobSubmission, SlurmRejected
from tests.support import slurm_job


def _spec(directives: str, *options: tuple[str, str | None], **fields) -> JobSubmission:
    script = "#!/bin/bash\n" + "".join(f"#SBATCH {line}\n" for line in directives.splitlines() if line) + "srun true\n"
    values = {"script": script, "account": "vision", "partition": "gpu", "options": [("partition", "gpu"), *options]}
    return slurm_job(**{**values, **fields})


def test_the_scripts_directives_reach_pyslurm():
    kwargs = description_kwargs(
        _spec("--qos=normal\n-C 'a100&ib'\n--signal=B:USR1@90\n--requeue\n--mail-type=END,FAIL\n"
              "--mail-user=a@example.org\n-J train\n--array=0-9%2\n--exclusive\n-o out-%A_%a.txt\n-e err-%j.txt")
    )  # fmt: skip
    assert kwargs["qos"] == "normal"
    assert kwargs["constraints"] == "a100&ib"
    assert kwargs["signal"] == {"signal": int(signal.SIGUSR1), "time": 90, "batch_only": True, "allow_reservation_overlap": False}
    assert kwargs["is_requeueable"] is True
    assert kwargs["mail_types"] == "END,FAIL" and kwargs["mail_user"] == "a@example.org"
    assert kwargs["name"] == "train"
    assert kwargs["array"] == "0-9%2"
    assert kwargs["resource_sharing"] == "no"
    assert (kwargs["standard_output"], kwargs["standard_error"]) == ("out-%A_%a.txt", "err-%j.txt")
    assert (kwargs["partitions"], kwargs["account"]) == ("gpu", "vision") and "environment" not in kwargs  # the gateway's


def test_the_portals_options_override_the_script_as_in_sbatch():
    spec = _spec("-t 30\n--gres=gpu:a100:2\n--no-requeue\n--requeue", ("time", "1-00:00:00"), ("gres", "gpu:h100:1"))
    kwargs = description_kwargs(spec)
    assert kwargs["time_limit"] == 1440 and isinstance(kwargs["time_limit"], int)
    assert kwargs["gres_per_node"] == "gpu:h100:1"
    assert kwargs["is_requeueable"] is True  # the later directive wins
    assert kwargs["name"] == "sbatch"  # what sbatch calls a script read from stdin


@pytest.mark.parametrize(
    ("directive", "attribute", "value"),
    [("--gres=gpu:2", "gres_per_node", "gpu:2"), ("--gres=gpu", "gres_per_node", "gpu:1"),
     ("--gpus-per-node=a100:2", "gres_per_node", "gpu:a100:2"), ("--gpus=a100:4", "gpus", "a100:4"),
     ("-G 3", "gpus", "3"), ("--gpus-per-task=gpu:1", "gpus_per_task", "1"), ("--cpus-per-gpu=8", "cpus_per_gpu", 8),
     ("-c 4", "cpus_per_task", 4), ("--mem=16G", "memory_per_node", "16G"), ("--mem-per-cpu=2048", "memory_per_cpu", "2048"),
     ("-N 1-2", "nodes", "1-2"), ("--oversubscribe", "resource_sharing", "yes"), ("--no-requeue", "is_requeueable", False),
     ("-D /tmp/x", "working_directory", "/tmp/x"), ("--nice=10", "nice", 10), ("-x h100-01", "excluded_nodes", "h100-01"),
     ("--signal=10", "signal", {"signal": 10, "time": 60, "batch_only": False, "allow_reservation_overlap": False})],
)  # fmt: skip
def test_option_forms(directive, attribute, value):
    assert description_kwargs(_spec(directive))[attribute] == value


def test_portal_only_options():
    kwargs = description_kwargs(_spec("", comment="gpuportal:x", reservation="resv_1", uid=1001, gid=1002))
    assert (kwargs["comment"], kwargs["reservations"], kwargs["user_id"], kwargs["group_id"]) == ("gpuportal:x", "resv_1", 1001, 1002)


def test_typed_specs_map_as_before():
    spec = slurm_job(script="#!/bin/bash\ntrue\n", account="vision", partition="gpu", gpus=4, gpu_type="a100", nodes=2,
                   cpus_per_gpu=2, memory_mb=8192, time_limit_minutes=10, stdout="/tmp/o-%j")  # fmt: skip
    kwargs = description_kwargs(spec)
    assert kwargs["gres_per_node"] == "gpu:a100:2" and kwargs["cpus_per_gpu"] == 2 and kwargs["nodes"] == "2"
    assert (kwargs["memory_per_node"], kwargs["time_limit"], kwargs["standard_output"]) == ("8192", 10, "/tmp/o-%j")


@pytest.mark.parametrize(
    ("directives", "ntasks"),
    [("-N 2", 2), ("-N 2 --ntasks-per-node=3", 6), ("--ntasks-per-node=4", 4), ("-N 1-2", None), ("-n 5 -N 2", 5),
     ("-N 2 --sockets-per-node=2", 4), ("", None)],
)  # fmt: skip
def test_the_implicit_task_count_is_sbatchs(directives, ntasks):
    assert description_kwargs(_spec(directives)).get("ntasks") == ntasks


@pytest.mark.parametrize(
    ("directive", "option"),
    [("--hint=nomultithread", "hint"), ("--mem=0", "mem"), ("--begin=now+1hour", "begin"), ("--mem-per-gpu=4G", "mem-per-gpu"),
     ("--exclusive=user", "exclusive"), ("--gpus=2 --ntasks-per-gpu=2", "ntasks-per-gpu"), ("-t UNLIMITED", "time"),
     ("--gres=gpu:1 --gpus-per-node=1", "gpus-per-node")],
)  # fmt: skip
def test_what_pyslurm_cannot_express_is_said(directive, option):
    with pytest.raises(NotExpressible) as raised:
        description_kwargs(_spec(directive))
    assert raised.value.option == option


def test_values_sbatch_refuses_are_rejected():
    with pytest.raises(SlurmRejected, match="signal"):
        description_kwargs(_spec("--signal=NOSUCHSIG@5"))


def test_the_descriptor_environment_is_what_sbatch_would_send_from_the_submit_directory():
    from portal.slurm.pyslurm_request import description_environment

    spec = slurm_job(script="#!/usr/bin/env python3\n#SBATCH -J py\n", account="vision", partition="gpu",
                   environment={"DATASET": "a,b 'c'"}, workdir="/home/alice/run", submit_dir="/home/alice")  # fmt: skip
    kwargs = description_environment(spec, submit_dir="/home/alice", slurm_conf="/x/slurm.conf", host="login1", umask="0022")
    assert kwargs["get_user_environment"] is True  # the login environment, read on the node
    assert kwargs["profile_types"] == "none"  # pyslurm's default would profile everything
    environment = kwargs["environment"]
    assert {k: environment[k] for k in environment if not k.startswith(("HYDRA", "I_MPI", "OMPI", "PRTE"))} == {
        "DATASET": "a,b 'c'", "PWD": "/home/alice", "SLURM_JOB_NAME": "gpuportal", "SLURM_EXPORT_ENV": "ALL",
        "SLURM_SUBMIT_DIR": "/home/alice", "SLURM_SUBMIT_HOST": "login1", "SLURM_UMASK": "0022",
        "SLURM_CONF": "/x/slurm.conf", "SLURM_PRIO_PROCESS": "0", "SLURM_CPUS_PER_GPU": "1",  # as sbatch's --cpus-per-gpu
    }  # fmt: skip
    assert environment["OMPI_MCA_plm_slurm_args"] == "--external-launcher"  # mpirun in the job starts ranks with srun
    per_node = slurm_job("#!/bin/bash\n#SBATCH --ntasks-per-node=2 --gpus-per-node=a100:2\n", account="vision", options=[])
    variables = description_environment(per_node, submit_dir="/", slurm_conf="", host="h", umask="0022")["environment"]
    assert (variables["SLURM_NTASKS_PER_NODE"], variables["SLURM_GPUS_PER_NODE"]) == ("2", "a100:2")
    # sbatch's set_envs (src/sbatch/opt.c): srun steps read their CPUs per task from SLURM_CPUS_PER_TASK
    per_task = slurm_job("#!/bin/bash\n#SBATCH --ntasks=1 --gpus-per-task=2 --cpus-per-task=2 -m block\n", account="vision", options=[])
    variables = description_environment(per_task, submit_dir="/", slurm_conf="", host="h", umask="0022")["environment"]
    assert (variables["SLURM_CPUS_PER_TASK"], variables["SLURM_DISTRIBUTION"]) == ("2", "block")


def test_the_processs_own_slurm_variables_are_out_of_the_environment_while_pyslurm_submits(monkeypatch):
    import os

    from portal.slurm.pyslurm import _without_process_slurm_env

    monkeypatch.setenv("SLURM_TIMEOUT", "7")  # a portal setting: no business of the job's
    monkeypatch.setenv("SLURM_DISTRIBUTION", "cyclic")  # inherited: srun in the job would read it as --distribution
    seen = _without_process_slurm_env(lambda: {k for k in os.environ if k.startswith("SLURM_")})
    assert seen == set() and (os.environ["SLURM_TIMEOUT"], os.environ["SLURM_DISTRIBUTION"]) == ("7", "cyclic")
