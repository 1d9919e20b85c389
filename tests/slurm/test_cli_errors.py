"""Error classification and argv construction of the CLI backend.

``subprocess.run`` is replaced by a recorder (a fake Slurm for unit tests of argv and error mapping
only); the stderr texts are Slurm 22.05.8's own, captured on the local cluster."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field

import pytest

from tests.support import slurm_job
from portal.slurm import cli, parsing
from portal.slurm.types import AssociationLimits, ReservationSpec, SlurmRejected, SlurmUnavailable


# --- classification ----------------------------------------------------------------------------

UNAVAILABLE_STDERR = [
    "squeue: error: slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
    "slurm_load_reservations error: Unable to contact slurm controller (connect failure)",
    "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation",
    "sacct: error: slurm_persist_conn_open_without_init: failed to open persistent connection to host:localhost:6819: Connection refused\n"
    "sacct: error: Sending PersistInit msg: Connection refused\n"
    "sacct: error: Problem talking to the database: Connection refused",
    "sacct: error: slurm_persist_conn_open: Something happened with the receiving/processing of the persistent "
    "connection init message to localhost:6819: Unable to connect to database\n"
    "sacct: error: Problem talking to the database: Unable to connect to database",
    "sinfo: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
    "sinfo: fatal: Could not establish a configuration source",
    # the primary slurmctld SIGKILLed while it answered (make test-site, issue 42)
    "sbatch: error: slurm_msg_sendto: address:port=10.77.0.41:6817 msg_type=4003: Unexpected missing socket error\n"
    "sbatch: error: Batch job submission failed: Unexpected missing socket error",
]

REJECTED_STDERR = [
    "sbatch: error: invalid partition specified: nope\nsbatch: error: Batch job submission failed: Invalid partition name specified",
    "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
    "sbatch: error: Batch job submission failed: Requested time limit is invalid (missing or exceeds some limit)",
    "sacctmgr: error: Failed to find cluster gpuportal account nosuch association in database",
    " This account 'nosuchacct' doesn't exist.\n        Contact your admin to add this account.",
    "scontrol: error: couldn't identify configured TRES 'gres/gpu:a100'",
]


@pytest.mark.parametrize("stderr", UNAVAILABLE_STDERR)
def test_classify_unavailable(stderr):
    error = parsing.classify_failure(returncode=1, stderr=stderr, command="x")
    assert isinstance(error, SlurmUnavailable)


@pytest.mark.parametrize("stderr", REJECTED_STDERR)
def test_classify_rejected_keeps_slurms_words(stderr):
    error = parsing.classify_failure(returncode=1, stderr=stderr, command="sbatch")
    assert isinstance(error, SlurmRejected)
    assert error.message.splitlines()[0] == stderr.strip().splitlines()[0].strip()
    assert error.command == "sbatch"


def test_classify_message_from_stdout_when_stderr_empty():
    error = parsing.classify_failure(returncode=1, stderr="", stdout="Reservation nosuch not found\n")
    assert isinstance(error, SlurmRejected) and error.message == "Reservation nosuch not found"


@pytest.mark.parametrize(
    ("stdout", "stderr", "patterns", "ok"),
    [
        (" Nothing new added.\n", "", parsing.NOTHING_TO_DO_PATTERNS, True),
        (" Nothing deleted\n", "", parsing.NOTHING_TO_DO_PATTERNS, True),
        # sacctmgr says "Nothing new added." also when the account is missing: stderr tells.
        (" Nothing new added.\n", " This account 'nosuchacct' doesn't exist.\n", parsing.NOTHING_TO_DO_PATTERNS, False),
        ("", "scancel: error: Kill job error on job id 5: Job/step already completing or completed",
         parsing.ALREADY_GONE_PATTERNS, True),
        ("", "scancel: error: Kill job error on job id 5: Invalid job id specified", parsing.ALREADY_GONE_PATTERNS, True),
        ("", "delete_reservation ReservationName=nosuch: Requested reservation is invalid",
         parsing.RESERVATION_MISSING_PATTERNS, True),
        ("", "scancel: error: Unable to contact slurm controller", parsing.ALREADY_GONE_PATTERNS, False),
        # Slurm 25.11.7's sacctmgr, captured: account and user association already there ...
        (" Already existing account gpuportal_ci on cluster gpuportal25\n", "", parsing.NOTHING_TO_DO_PATTERNS, True),
        (" Request didn't affect anything\n Nothing added.\n Make sure the accounts requested here have been added "
         "to the system/cluster. (sacctmgr add account...)\n", "", parsing.NOTHING_TO_DO_PATTERNS, True),
        # ... and a user added to a missing account: the same "Nothing added.", a failure.
        (" No account nosuchacct on cluster gpuportal25, skipping.\n Nothing added.\n Make sure the accounts "
         "requested here have been added to the system/cluster. (sacctmgr add account...)\n", "",
         parsing.NOTHING_TO_DO_PATTERNS, False),
    ],
)  # fmt: skip
def test_idempotent_success(stdout, stderr, patterns, ok):
    assert cli.is_idempotent_success(stdout, stderr, patterns) is ok


# --- a recording subprocess.run -----------------------------------------------------------------


@dataclass
class FakeRun:
    """Replaces subprocess.run; answers with scripted results and records every call."""

    results: list = field(default_factory=list)  # (returncode, stdout, stderr) or an exception
    calls: list = field(default_factory=list)

    def __call__(self, argv, **kwargs):
        call = {"argv": argv, **kwargs}
        for fd in kwargs.get("pass_fds", ()):  # the job's export file: read while it is open
            call["exported"] = os.pread(fd, 1 << 20, 0)
            call["argv"] = [a.replace(f"--export-file={fd}", "--export-file=FD") for a in argv]
        self.calls.append(call)
        result = self.results.pop(0) if self.results else (0, "", "")
        if isinstance(result, BaseException):
            raise result
        returncode, stdout, stderr = result
        return subprocess.CompletedProcess(argv, returncode, stdout, stderr)


@pytest.fixture
def fake_run(monkeypatch):
    fake = FakeRun()
    monkeypatch.setattr(cli.subprocess, "run", fake)
    return fake


@pytest.fixture
def gateway(monkeypatch):
    monkeypatch.setenv("SQUEUE_USERS", "nobody")  # must never reach squeue
    monkeypatch.setenv("SBATCH_PARTITION", "evil")
    return cli.CliGateway(cluster="gpuportal", timeout=7, slurm_conf="/etc/x/slurm.conf", bin_dir="/opt/slurm/bin")


def _spec(**overrides):
    base = {"script": "#!/bin/bash\necho hi\n", "account": "vision", "partition": "gpu"}
    return slurm_job(**{**base, **overrides})


def test_submit_argv_hostile_values_are_single_elements(fake_run, gateway):
    fake_run.results = [(0, "4242;gpuportal\n", "")]
    spec = _spec(
        name="x;rm -rf /",
        comment="gpuportal:$(id)`id`",
        gpus=4,
        nodes=2,
        gpu_type="a100",
        cpus_per_gpu=3,
        memory_mb=2048,
        time_limit_minutes=90,
        workdir="/home/a b/$(id)",
        submit_dir="/tmp",
        stdout="/tmp/out-%j.txt",
        stderr="/tmp/err-%j.txt",
        reservation="resv1",
        uid=1001,
        gid=1002,
    )
    assert gateway.submit(spec) == 4242
    (call,) = fake_run.calls
    assert call["argv"] == [
        "/opt/slurm/bin/sbatch",
        "--parsable",
        "--ignore-pbs",
        "--export-file=FD",
        "--export=SLURM_EXPORT_ENV",
        "--job-name=x;rm -rf /",
        "--partition=gpu",
        "--nodes=2",
        "--chdir=/home/a b/$(id)",
        "--gres=gpu:a100:2",
        "--cpus-per-gpu=3",
        "--mem=2048",
        "--time=90",
        "--output=/tmp/out-%j.txt",
        "--error=/tmp/err-%j.txt",
        "--account=vision",
        "--comment=gpuportal:$(id)`id`",
        "--reservation=resv1",
        "--uid=1001",
        "--gid=1002",
    ]
    assert call.get("shell", False) is False
    assert call["timeout"] == 7
    assert call["input"] == spec.request.script  # the script goes to stdin
    env = call["env"]
    assert env["SLURM_CONF"] == "/etc/x/slurm.conf"
    assert "SLURM_TIME_FORMAT" not in env  # the gateway's parsers' only: sbatch would pass it into the job
    assert env["SLURM_EXPORT_ENV"] == "ALL"
    assert "SQUEUE_USERS" not in env and "SBATCH_PARTITION" not in env


def test_submit_untyped_gpus_and_no_optional_flags(fake_run, gateway):
    fake_run.results = [(0, "7\n", "")]
    gateway.submit(_spec(gpus=1))
    argv = fake_run.calls[0]["argv"]
    assert "--gres=gpu:1" in argv
    assert not any(a.startswith(("--mem", "--time", "--output", "--error", "--comment", "--uid", "--gid")) for a in argv)


def test_submit_without_gpus_has_no_gres(fake_run, gateway):
    fake_run.results = [(0, "7\n", "")]
    gateway.submit(_spec(gpus=0))
    assert not any(a.startswith(("--gres", "--cpus-per-gpu")) for a in fake_run.calls[0]["argv"])


@pytest.mark.parametrize("field_name", ["name", "comment"])
def test_submit_control_characters_rejected(fake_run, gateway, field_name):
    with pytest.raises(SlurmRejected, match="control characters"):
        gateway.submit(_spec(**{field_name: "a\nb"}))
    assert fake_run.calls == []


def test_environment_goes_in_an_export_file_never_in_the_script_argv_or_sbatchs_environment(fake_run, gateway):
    fake_run.results = [(0, "8\n", "")]
    script = "#!/usr/bin/env python3\n#SBATCH --mail-type=NONE\nimport os\nprint(os.environ['A'])\n"
    gateway.submit(_spec(script=script, environment={"A": "it's $(id); `rm -rf /`\nline 2", "B_2": "x,y=z", "LD_PRELOAD": "/x.so"}))
    (call,) = fake_run.calls
    assert call["input"] == script  # a python3 script runs as written
    assert call["exported"] == (
        b"A=it's $(id); `rm -rf /`\nline 2\0B_2=x,y=z\0LD_PRELOAD=/x.so\0PWD=/tmp\0SLURM_JOB_NAME=gpuportal\0"
    )
    assert "--export-file=FD" in call["argv"] and "--export=SLURM_EXPORT_ENV" in call["argv"]
    assert all("$(id)" not in arg and "x,y" not in arg for arg in call["argv"])
    # sbatch itself (root) never runs with the job's variables; its SLURM_EXPORT_ENV=ALL reaches the
    # job (srun steps inherit its environment); it runs in the submit directory (SLURM_SUBMIT_DIR)
    assert "LD_PRELOAD" not in call["env"] and "A" not in call["env"]
    assert call["env"]["SLURM_EXPORT_ENV"] == "ALL" and "SLURM_TIME_FORMAT" not in call["env"]
    assert call["cwd"] == "/tmp"


def test_a_missing_submit_directory_is_refused_before_sbatch(fake_run, gateway):
    with pytest.raises(SlurmRejected, match="does not exist on the submit host"):
        gateway.submit(_spec(submit_dir="/nonexistent/dir"))
    assert fake_run.calls == []


@pytest.mark.parametrize("name", ["1A", "A-B", "A B", "", "A=B", "$(id)"])
def test_environment_bad_names_rejected(fake_run, gateway, name):
    with pytest.raises(SlurmRejected, match="environment variable name"):
        gateway.submit(_spec(environment={name: "x"}))
    assert fake_run.calls == []


def test_sbatch_rejection_carries_slurms_message(fake_run, gateway):
    fake_run.results = [(1, "", REJECTED_STDERR[0] + "\n")]
    with pytest.raises(SlurmRejected) as info:
        gateway.submit(_spec(partition="nope"))
    assert "invalid partition specified: nope" in info.value.message


def test_timeout_is_unavailable(fake_run, gateway):
    fake_run.results = [subprocess.TimeoutExpired(["squeue"], 7)]
    with pytest.raises(SlurmUnavailable, match="within 7 s"):
        gateway.queue()


def test_missing_executable_is_unavailable(fake_run, gateway):
    fake_run.results = [FileNotFoundError(2, "No such file or directory", "/opt/slurm/bin/squeue")]
    with pytest.raises(SlurmUnavailable, match="cannot be run"):
        gateway.queue()


def test_controller_down_is_unavailable(fake_run, gateway):
    fake_run.results = [(1, "", UNAVAILABLE_STDERR[0])]
    with pytest.raises(SlurmUnavailable):
        gateway.queue()


def test_queue_and_accounting_argv(fake_run, gateway):
    import datetime as dt

    gateway.queue()
    gateway.accounting(dt.datetime(2026, 1, 1, tzinfo=dt.UTC), dt.datetime(2026, 1, 2, tzinfo=dt.UTC))
    squeue, sacct = (call["argv"] for call in fake_run.calls)
    assert squeue[:5] == ["/opt/slurm/bin/squeue", "-h", "-a", "-t", "all"]
    assert squeue[5:] == ["-o", cli.QUEUE_FORMAT] and squeue[6].endswith("%k")
    assert sacct[:6] == ["/opt/slurm/bin/sacct", "-X", "-a", "--parsable2", "--noheader", "--delimiter=\x1f"]
    assert sacct[-2:] == ["-M", "gpuportal"]
    assert sacct[sacct.index("-o") + 1].endswith("JobName,Comment")


def test_cancel_finished_job_is_not_an_error(fake_run, gateway):
    fake_run.results = [(1, "", "scancel: error: Kill job error on job id 5: Job/step already completing or completed")]
    gateway.cancel(5)
    assert fake_run.calls[0]["argv"] == ["/opt/slurm/bin/scancel", "5"]


def test_account_add_twice_is_fine(fake_run, gateway):
    fake_run.results = [(0, " Adding Account(s)\n", ""), (1, " Nothing new added.\n", "")]
    gateway.account_add("vision", description="Vision team")
    gateway.account_add("vision", description="Vision team")
    assert fake_run.calls[0]["argv"] == [
        "/opt/slurm/bin/sacctmgr", "-i", "-n", "-P", "add", "account", "vision", "Cluster=gpuportal",
        "Description=Vision team",
    ]  # fmt: skip


def test_user_add_to_missing_account_is_rejected(fake_run, gateway):
    fake_run.results = [(1, " Nothing new added.\n", REJECTED_STDERR[4])]
    with pytest.raises(SlurmRejected, match="doesn't exist"):
        gateway.user_add("alice", "nosuchacct")


def test_user_add_default_sets_default_account(fake_run, gateway):
    fake_run.results = [(1, " Nothing new added.\n", ""), (0, " Modified users...\n", "")]
    gateway.user_add("alice", "vision", default=True)
    add, modify = (call["argv"][4:] for call in fake_run.calls)
    assert add == ["add", "user", "alice", "Account=vision", "Cluster=gpuportal", "DefaultAccount=vision"]
    assert modify == ["modify", "user", "where", "name=alice", "cluster=gpuportal", "set", "DefaultAccount=vision"]


def test_limits_set_clears_absent_managed_keys(fake_run, gateway):
    fake_run.results = [
        (0, "vision||gres/gpu:a100=300,gres/gpu=600,cpu=100|gres/gpu=4\nvision|alice||\n", ""),
        (0, " Modified account associations...\n", ""),
    ]
    gateway.association_limits_set(AssociationLimits(account="vision", grp_tres_mins={"gres/gpu": 900}))
    assert fake_run.calls[1]["argv"][4:] == [
        "modify", "account", "where", "name=vision", "cluster=gpuportal", "set",
        "GrpTRESMins=gres/gpu=900,gres/gpu:a100=-1", "GrpTRES=gres/gpu=-1",
    ]  # fmt: skip


def test_reservation_gpu_tres_refused_on_22_05(fake_run, gateway):
    import datetime as dt

    fake_run.results = [(0, "slurm-wlm 22.05.8\n", "")]
    spec = ReservationSpec(
        name="r1", start=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), end=dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
        accounts=("vision",), tres={"gres/gpu:a100": 2},
    )  # fmt: skip
    with pytest.raises(SlurmRejected, match="cannot reserve GPU counts"):
        gateway.reservation_create(spec)
    assert [call["argv"][0] for call in fake_run.calls] == ["/opt/slurm/bin/sinfo"]


def test_reservation_create_argv_and_delete_missing(fake_run, gateway):
    import datetime as dt

    fake_run.results = [
        (0, "Reservation created: r1\n", ""),
        (1, "", "delete_reservation ReservationName=r1: Requested reservation is invalid\n"),
    ]
    spec = ReservationSpec(
        name="r1", start=dt.datetime(2026, 1, 1, 9, tzinfo=dt.UTC), end=dt.datetime(2026, 1, 1, 10, tzinfo=dt.UTC),
        accounts=("vision", "nlp"), nodes=("h100-01",), flags=("IGNORE_JOBS",),
    )  # fmt: skip
    assert gateway.reservation_create(spec) == "r1"
    argv = fake_run.calls[0]["argv"]
    assert argv[:4] == ["/opt/slurm/bin/scontrol", "create", "reservation", "ReservationName=r1"]
    assert "Accounts=vision,nlp" in argv and "Nodes=h100-01" in argv and "Flags=IGNORE_JOBS" in argv
    gateway.reservation_delete("r1")  # missing = success


def test_ping_down_is_unavailable(fake_run, gateway):
    fake_run.results = [(1, "Slurmctld(primary) at vm is DOWN\n", "")]
    with pytest.raises(SlurmUnavailable):
        gateway.ping()
