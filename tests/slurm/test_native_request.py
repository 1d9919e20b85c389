"""portal.slurm.native_request: the effective request as the job descriptor sbatch 22.05 builds, and
portal.slurm.native's choice of when to use it. Pure; what Slurm makes of the descriptors is proven
against sbatch itself on the local 22.05 cluster (tests/jobs/test_native_same_request.py)."""

from __future__ import annotations

import os

import pytest

from portal.slurm import native_request as nr
from portal.slurm.native import client_side_plugins
from portal.slurm.pyslurm_request import NotExpressible
from portal.slurm.types import JobSpec, SlurmRejected

ENV = {"SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_SUBMIT_DIR": "/srv", "SLURM_UMASK": "0022"}


def _job(directives: str, *options: tuple[str, str | None], cwd: str = "/srv") -> dict:
    script = "#!/bin/bash\n" + "".join(f"#SBATCH {line}\n" for line in directives.splitlines() if line) + "srun true\n"
    spec = JobSpec(script=script, account="vision", partition="gpu", options=(("partition", "gpu"), *options))
    return nr.job_descriptor(spec, script=script, process_env=ENV, cwd=cwd, submit_line="sbatch --parsable")


def test_defaults_are_sbatchs():
    job = _job("-t 30")
    fields = job["fields"]
    assert fields["name"] == "sbatch"  # a script on stdin, no -J
    assert (fields["user_id"], fields["group_id"]) == (os.getuid(), os.getgid())
    assert fields["work_dir"] == "/srv" and fields["std_in"] == "/dev/null"
    assert fields["min_cpus"] == 1 and "num_tasks" not in fields and "min_nodes" not in fields
    assert fields["task_dist"] == nr.SLURM_DIST_UNKNOWN and fields["contiguous"] == 0 and fields["mail_type"] == 0
    assert (fields["account"], fields["partition"], fields["time_limit"]) == ("vision", "gpu", 30)
    assert fields["submit_line"] == "sbatch --parsable"
    env = dict(item.split("=", 1) for item in job["environment"])
    assert env["SLURM_EXPORT_ENV"] == "NONE" and env["SLURM_GET_USER_ENV"] == "1" and env["SLURM_CONF"] == ENV["SLURM_CONF"]
    assert "SLURM_JOB_NAME" not in env and job["argv"] == []


def test_tasks_nodes_and_cpus_as_sbatch_massages_them():
    fields = _job("-N 2\n-n 4\n-c 3")["fields"]
    assert (fields["min_nodes"], fields["max_nodes"], fields["num_tasks"]) == (2, 2, 4)
    assert fields["min_cpus"] == 12 and fields["cpus_per_task"] == 3 and fields["pn_min_cpus"] == 3
    assert fields["bitflags"] == nr.JOB_NTASKS_SET | nr.JOB_CPUS_SET
    # a fixed node count and tasks per node set the task count; fewer tasks than nodes shrink the nodes
    assert _job("-N 2\n--ntasks-per-node=3")["fields"]["num_tasks"] == 6
    shrunk = _job("-N 3\n-n 2")["fields"]
    assert (shrunk["min_nodes"], shrunk["max_nodes"]) == (2, 2)
    ranged = _job("-N 1-2")["fields"]
    assert (ranged["min_nodes"], ranged["max_nodes"], ranged["min_cpus"]) == (1, 2, 1) and "num_tasks" not in ranged


@pytest.mark.parametrize(
    ("directive", "field", "value"),
    [("--gres=gpu:a100:2", "tres_per_node", "gres:gpu:a100:2"), ("--gres=gpu:1,gres:shard:2", "tres_per_node", "gres:gpu:1,gres:shard:2"),
     ("--gpus=a100:4", "tres_per_job", "gres:gpu:a100:4"), ("--gpus-per-node=2", "tres_per_node", "gres:gpu:2"),
     ("--cpus-per-gpu=8", "cpus_per_tres", "gres:gpu:8"), ("--mem=16G", "pn_min_memory", 16384),
     ("--mem=0", "pn_min_memory", 0), ("--mem-per-cpu=2048", "pn_min_memory", 2048 | nr.MEM_PER_CPU),
     ("--exclusive", "shared", nr.JOB_SHARED_NONE), ("--oversubscribe", "shared", nr.JOB_SHARED_OK),
     ("--requeue", "requeue", 1), ("--no-requeue", "requeue", 0), ("--nice=10", "nice", nr.NICE_OFFSET + 10),
     ("--nice", "nice", nr.NICE_OFFSET + 100), ("--open-mode=append", "open_mode", nr.OPEN_MODE_APPEND),
     ("-t 1-00:00:00", "time_limit", 1440), ("-t UNLIMITED", "time_limit", nr.INFINITE), ("--time-min=5", "time_min", 5),
     ("--array=0-9%2", "array_inx", "0-9%2"), ("-x h100-01", "exc_nodes", "h100-01"), ("-C a100", "features", "a100"),
     ("--dependency=singleton", "dependency", "singleton"), ("--contiguous", "contiguous", 1),
     ("-o out-%j.txt", "std_out", "/srv/out-%j.txt"), ("-e /abs/err.txt", "std_err", "/abs/err.txt"),
     ("-D sub", "work_dir", "/srv/sub"), ("-J train", "name", "train")],
)  # fmt: skip
def test_option_forms(directive, field, value):
    assert _job(directive)["fields"][field] == value


def test_the_environment_sbatch_adds_for_the_options():
    env = dict(item.split("=", 1) for item in _job("-J train\n-n 2\n-c 4\n--gpus-per-node=2\n--cpus-per-gpu=3\n"
                                                   "--open-mode=append\n--dependency=singleton\n--ntasks-per-node=2")["environment"])  # fmt: skip
    assert env["SLURM_JOB_NAME"] == "train" and env["SLURM_NTASKS"] == env["SLURM_NPROCS"] == "2"
    assert env["SLURM_CPUS_PER_TASK"] == "4" and env["SLURM_GPUS_PER_NODE"] == "2" and env["SLURM_CPUS_PER_GPU"] == "3"
    assert env["SLURM_OPEN_MODE"] == "a" and env["SLURM_JOB_DEPENDENCY"] == "singleton" and env["SLURM_NTASKS_PER_NODE"] == "2"


def test_the_portals_options_override_the_script():
    fields = _job("-t 30\n--gres=gpu:a100:2", ("time", "60"), ("gres", "gpu:h100:1"))["fields"]
    assert (fields["time_limit"], fields["tres_per_node"]) == (60, "gres:gpu:h100:1")
    fields = _job("--mem=4G", ("mem-per-cpu", "100"))["fields"]
    assert fields["pn_min_memory"] == 100 | nr.MEM_PER_CPU  # the later one of two exclusive options


@pytest.mark.parametrize(
    ("directive", "option"),
    [("--gpus-per-task=1", "gpus-per-task"), ("--mem-per-gpu=4G", "mem-per-gpu"), ("--signal=B:USR1@60", "signal"),
     ("--begin=now+1hour", "begin"), ("--hint=nomultithread", "hint"), ("-w a100-01", "nodelist"),
     ("--exclusive=user", "exclusive"), ("--mem=1.5G", "mem"), ("--mem=512K", "mem"), ("-N 2k", "nodes"),
     ("-x /etc/nodes", "exclude"), ("--mail-type=END", "mail-type"), ("-n 2x", "ntasks")],
)  # fmt: skip
def test_what_only_sbatch_passes_is_not_expressible(directive, option):
    with pytest.raises(NotExpressible) as refused:
        _job(directive)
    assert refused.value.option == option


def test_a_time_sbatch_refuses_is_refused():
    with pytest.raises(SlurmRejected):
        _job("", ("time", "soon"))


def test_sbatchs_own_variables_for_every_job():
    env = nr.sbatch_process_environment({"SLURM_CONF": "/x", "PATH": "/bin", "SLURMD_X": "1"}, cwd="/srv", host="login1")
    assert env["SLURM_CONF"] == "/x" and env["SLURMD_X"] == "1" and "PATH" not in env  # env_array_merge_slurm: "SLURM*"
    assert (env["SLURM_SUBMIT_DIR"], env["SLURM_SUBMIT_HOST"]) == ("/srv", "login1")
    assert {f"SLURM_RLIMIT_{name}" for name in nr.RLIMITS} <= set(env)
    assert all(value.isdigit() for key, value in env.items() if key.startswith("SLURM_RLIMIT_"))
    assert len(env["SLURM_UMASK"]) == 4 and env["SLURM_UMASK"].startswith("0")


def test_client_side_plugins_keep_sbatch(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n# CliFilterPlugins=lua\n")
    assert client_side_plugins(str(conf)) == ""
    (tmp_path / "plugstack.conf").write_text("# nothing\n\n")
    assert client_side_plugins(str(conf)) == ""
    (tmp_path / "plugstack.conf").write_text("required /usr/lib/spank/x11.so\n")
    assert "SPANK" in client_side_plugins(str(conf))
    (tmp_path / "plugstack.conf").unlink()
    for line in ("CliFilterPlugins=lua", "PropagateResourceLimits=NONE", "plugstackconfig=/etc/x"):
        conf.write_text(f"ClusterName=x\n{line}\n")
        assert line.split("=")[0].lower() in client_side_plugins(str(conf)).lower()
    assert "unreadable" in client_side_plugins(str(tmp_path / "none.conf"))


@pytest.mark.parametrize(("script", "words"), [("", "is empty"), (" \n\t\n", "only whitespace"),
                                               ("echo hi\n", "does not look like a batch script"),
                                               ("#!/bin/sh\r\ntrue\r\n", "DOS line breaks")])  # fmt: skip
def test_sbatchs_checks_of_the_script(script, words):
    with pytest.raises(SlurmRejected) as refused:
        nr.check_script(script)
    assert words in refused.value.message and refused.value.message.startswith("sbatch: error: ")
    nr.check_script("#!/bin/bash\ntrue\n")
