"""Contract of every Slurm gateway backend, against a real cluster (``scripts/cluster up``).

Runs for every backend on every local cluster (the ``slurm_target`` fixture): cli on Slurm 22.05
(``scripts/cluster up``) and 25.11 (``scripts/cluster up --slurm 25.11``), pyslurm on 25.11 (built by
``scripts/pyslurm``); the gateway comes from ``portal.slurm.get_gateway()``. Expects the local
emulated clusters' shape: nodes a100-01, a100-02 (4 x a100), h100-01 (4 x h100); partitions gpu
(default, MaxTime 72 h) and debug (MaxTime 1 h). Needs root (useradd, --uid, reservations).

Everything created is named gpuportal_ci*/gpuportal-ci* and cleaned up (jobs cancelled,
reservations deleted, limits cleared); the accounts themselves are left in place (harmless).
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import pwd
import re
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests import support
from tests.support import skip_unless_ci, slurm_job

import portal.slurm as slurm
from portal.slurm import AssociationLimits, JobSubmission, ReservationSpec, SlurmRejected, SlurmUnavailable
from portal.slurm.types import PartitionLimits

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
CI_USER = "gpuportal-ci"
CI_ACCOUNT = "gpuportal_ci"
CI_LIMITS_ACCOUNT = "gpuportal_ci_limits"
WAIT_SECONDS = 30


wait_for = functools.partial(support.wait_for, timeout=WAIT_SECONDS, interval=0.3)


@pytest.fixture
def gateway(settings, slurm_target):
    if not settings.SLURM_CONF and not os.environ.get("SLURM_CONF"):
        skip_unless_ci("no Slurm cluster configured (run scripts/cluster up, or set SLURM_CONF)")
    gateway = slurm.get_gateway()
    assert gateway.name == slurm_target.backend
    try:
        gateway.ping()
    except SlurmUnavailable as exc:
        skip_unless_ci(f"Slurm {slurm_target.release} cluster not up (scripts/cluster up {' '.join(slurm_target.cluster_args)}): {exc}")
    assert slurm.same_release(gateway.version(), slurm_target.release)
    return gateway


@pytest.fixture
def ci_user():
    """The Unix user jobs run as (created once, tests run as root)."""
    try:
        entry = pwd.getpwnam(CI_USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", CI_USER], check=True, timeout=30)
        entry = pwd.getpwnam(CI_USER)
    return entry


@pytest.fixture
def ci_association(gateway, ci_user):
    gateway.account_add(CI_ACCOUNT, description="gpuportal contract tests")
    gateway.user_add(CI_USER, CI_ACCOUNT, default=True)
    return CI_ACCOUNT


@pytest.fixture
def job_dir(ci_user):
    path = Path(tempfile.mkdtemp(prefix="gpuportal-ci-"))
    os.chown(path, ci_user.pw_uid, ci_user.pw_gid)
    return path


@pytest.fixture
def cleanup_jobs(gateway):
    job_ids: list[int] = []
    yield job_ids
    for job_id in job_ids:
        try:
            gateway.cancel(job_id)
        except SlurmUnavailable:
            pass


def _tag() -> str:
    return f"gpuportal-ci:{uuid.uuid4()}"


def _job(account, ci_user, job_dir, *, script, **overrides) -> JobSubmission:
    values = {
        "script": script,
        "account": account,
        "partition": "gpu",
        "name": "contract",
        "gpus": 1,
        "gpu_type": "a100",
        "time_limit_minutes": 10,
        "workdir": str(job_dir),
        "stdout": str(job_dir / "job-%j.out"),
        "comment": _tag(),
        "uid": ci_user.pw_uid,
        "gid": ci_user.pw_gid,
    }
    values.update(overrides)
    return slurm_job(**values)


def _queue_entry(gateway, job_id):
    return next((entry for entry in gateway.queue() if entry.job_id == job_id), None)


def _accounting_record(gateway, job_id, since):
    now = dt.datetime.now(dt.UTC)
    return next((r for r in gateway.accounting(since, now + dt.timedelta(minutes=1)) if r.job_id == job_id), None)


# --- inventory ---------------------------------------------------------------------------------


def test_version_and_ping(gateway):
    assert gateway.ping() is True
    assert gateway.version()[:2].isdigit()


def test_partitions(gateway):
    parts = {p.name: p for p in gateway.partitions()}
    assert {"gpu", "debug"} <= set(parts)
    assert parts["gpu"].is_default and parts["gpu"].max_time_minutes == 4320
    assert not parts["debug"].is_default and parts["debug"].max_time_minutes == 60
    assert set(parts["gpu"].nodes) == {"a100-01", "a100-02", "h100-01"}


def test_nodes(gateway):
    nodes = {n.name: n for n in gateway.nodes()}
    assert set(nodes) == {"a100-01", "a100-02", "h100-01"}
    totals: dict[str, int] = {}
    for node in nodes.values():
        totals[node.gpu_type] = totals.get(node.gpu_type, 0) + node.gpus_total
        assert 0 <= node.gpus_allocated <= node.gpus_total
        assert node.cpus_total > 0 and node.memory_mb > 0
        assert "gpu" in node.partitions
    assert totals == {"a100": 8, "h100": 4}


def test_policy_qos_features_and_max_array_size(gateway):
    """What the spec checks QOS, --constraint and --array against (the local clusters: QOS normal,
    the guide's node features a100/h100, MaxArraySize left at Slurm's default); the features, read
    with the nodes (Node.features), as `scontrol show node` prints them."""
    policy = gateway.policy()
    assert "normal" in policy.qos
    assert "normal" in policy.account_qos["root"]
    features = {node.name: node.features for node in gateway.nodes()}
    assert set(features) == {"a100-01", "a100-02", "h100-01"}
    nodes = support.slurm_command("scontrol", "show", "node", "-o").stdout
    shown = dict(re.findall(r"NodeName=(\S+) .*?AvailableFeatures=(\S+)", nodes))
    assert {n: tuple(f for f in shown[n].split(",") if f != "(null)") for n in shown} == features
    assert features["a100-01"] == ("a100",) and features["h100-01"] == ("h100",)
    assert policy.max_array_size == 1001


def test_partition_limits_come_with_the_partitions_as_scontrol_shows_them(gateway):
    """The partitions' allocation flags (Partition.limits), read in the partitions' one call: the
    local clusters' ``train`` is OverSubscribe=EXCLUSIVE, ``gpu`` and ``debug`` set none of them."""
    limits = {partition.name: partition.limits for partition in gateway.partitions()}
    shown = support.slurm_command("scontrol", "show", "partition", "-o").stdout
    oversubscribe = dict(re.findall(r"PartitionName=(\S+) .*?OverSubscribe=(\S+)", shown))
    assert {name: limit.exclusive for name, limit in limits.items()} == {
        name: value.startswith("EXCLUSIVE") for name, value in oversubscribe.items()
    }
    assert limits["train"] == PartitionLimits(exclusive=True)
    assert limits["gpu"] == limits["debug"] == PartitionLimits()


@pytest.fixture
def accounts_ever():
    """Every account slurmdbd has held, deleted ones too (sacctmgr's ``withdeleted``): sreport keeps
    the usage of an account deleted since."""
    listed = support.slurm_command("sacctmgr", "-n", "-P", "show", "account", "withdeleted", "format=account").stdout
    return set(listed.split())


def test_account_gpu_minutes_is_sreports_answer(gateway, accounts_ever):
    """sreport accepts the gateway's argv (a wrong one exits nonzero: SlurmRejected) and answers
    whole GPU-minutes per account slurmdbd knows (sreport keeps the usage of an account deleted
    since, as sacctmgr's ``withdeleted`` lists it); a window in the future has no usage."""
    now = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)
    month = gateway.account_gpu_minutes(now - dt.timedelta(days=30), now)
    assert set(month) <= accounts_ever | {a.account for a in gateway.associations()}
    assert all(isinstance(minutes, int) and minutes >= 0 for minutes in month.values())
    assert gateway.account_gpu_minutes(now + dt.timedelta(days=1), now + dt.timedelta(days=2)) == {}


def test_usage_rolled_up_is_false_for_hours_to_come(gateway):
    """sreport accepts the roll-up probe's argv; an hour that has not come is never rolled up (how
    far slurmdbd has rolled up, against its own tables: tests/accounting/test_reconcile_slurm.py)."""
    hour = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)
    assert gateway.usage_rolled_up(hour + dt.timedelta(hours=1), hour + dt.timedelta(hours=2)) is False
    assert isinstance(gateway.usage_rolled_up(hour - dt.timedelta(hours=1), hour), bool)


# --- associations ------------------------------------------------------------------------------


def test_account_and_user_add_twice_is_fine(gateway, ci_user):
    for _ in range(2):
        gateway.account_add(CI_ACCOUNT, description="gpuportal contract tests")
        gateway.user_add(CI_USER, CI_ACCOUNT, default=True)
    rows = {(a.account, a.user): a for a in gateway.associations()}
    assert (CI_ACCOUNT, "") in rows
    assert rows[(CI_ACCOUNT, "")].parent == "root"
    assert rows[(CI_ACCOUNT, CI_USER)].is_default


def test_user_remove_missing_is_fine(gateway, ci_association):
    gateway.user_remove("gpuportal-ci-nobody", ci_association)


def test_limits_round_trip(gateway):
    gateway.account_add(CI_LIMITS_ACCOUNT, description="gpuportal contract tests (limits)")
    try:
        wanted = AssociationLimits(
            account=CI_LIMITS_ACCOUNT,
            grp_tres_mins={"gres/gpu": 600, "gres/gpu:a100": 300},
            grp_tres={"gres/gpu": 4},
        )
        gateway.association_limits_set(wanted)
        assert gateway.association_limits_get(CI_LIMITS_ACCOUNT) == wanted
        # Keys left out are cleared.
        smaller = AssociationLimits(account=CI_LIMITS_ACCOUNT, grp_tres_mins={"gres/gpu": 900})
        gateway.association_limits_set(smaller)
        assert gateway.association_limits_get(CI_LIMITS_ACCOUNT) == smaller
        gateway.account_usage_reset(CI_LIMITS_ACCOUNT)
    finally:
        gateway.association_limits_set(AssociationLimits(account=CI_LIMITS_ACCOUNT))
    assert gateway.association_limits_get(CI_LIMITS_ACCOUNT) == AssociationLimits(account=CI_LIMITS_ACCOUNT)


def test_limits_of_unknown_account_rejected(gateway):
    with pytest.raises(SlurmRejected):
        gateway.association_limits_get("gpuportal_ci_nosuch")


# --- jobs --------------------------------------------------------------------------------------


def test_typed_gpu_job_queue_find_and_accounting(gateway, ci_association, ci_user, job_dir, cleanup_jobs):
    since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    spec = _job(
        ci_association, ci_user, job_dir,
        script="#!/bin/bash\necho \"CVD=$CUDA_VISIBLE_DEVICES\"\necho \"GREETING=$GREETING\"\nid -un\n",
        name="contract; $(id) | rm -rf /",
        environment={"GREETING": "it's $(id) `x`"},
    )  # fmt: skip
    job_id = gateway.submit(spec)
    tag = dict(spec.command_line)["comment"]
    cleanup_jobs.append(job_id)

    entry = _queue_entry(gateway, job_id)
    assert entry is not None, "a just-submitted job is in the queue (MinJobAge keeps finished ones)"
    assert entry.comment == tag and entry.name == spec.request.name
    assert entry.user == CI_USER and entry.account == ci_association and entry.partition == "gpu"
    assert entry.tres_per_node == "gres:gpu:a100:1"
    assert entry.time_limit_minutes == 10
    assert entry.submit_time is not None and entry.submit_time.tzinfo is not None
    assert abs(entry.submit_time - dt.datetime.now(dt.UTC)) < dt.timedelta(minutes=2)
    assert gateway.find_by_comment(tag) == job_id
    assert gateway.find_by_comment(_tag()) is None
    assert gateway.find_by_comments([tag, _tag(), ""]) == {tag: job_id}

    wait_for(lambda: (e := _queue_entry(gateway, job_id)) is None or e.state == "COMPLETED", what="job completion")
    record = wait_for(
        lambda: (r := _accounting_record(gateway, job_id, since)) and r.partition and r.end_time and r,
        what="the accounting record",
    )
    assert record.state == "COMPLETED" and record.exit_code == 0
    assert record.gpus == 1 and record.gpu_type == "a100"
    assert record.comment == tag and record.name == spec.request.name
    assert record.user == CI_USER and record.nodes.startswith("a100-")
    assert record.alloc_tres["mem"] > 0
    by_id = gateway.accounting(since, dt.datetime.now(dt.UTC), job_ids={job_id})
    assert [r.job_id for r in by_id] == [job_id] and by_id[0].comment == tag
    assert gateway.accounting(since, dt.datetime.now(dt.UTC), job_ids=set()) == []
    # a window that ends in the second the job became eligible (its submit second: no --begin, no
    # dependency) has it: sacct's -E T leaves out what became eligible at T (a CI run's flake, when
    # the job ran within the second of the call's "now")
    in_its_second = record.submit_time + dt.timedelta(microseconds=500_000)
    assert [r.job_id for r in gateway.accounting(since, in_its_second, job_ids={job_id})] == [job_id]
    assert [r.job_id for r in gateway.accounting(since, in_its_second) if r.job_id == job_id] == [job_id]

    output = wait_for(lambda: (job_dir / f"job-{job_id}.out").exists() and (job_dir / f"job-{job_id}.out").read_text(),
                      what="the job's output file")  # fmt: skip
    assert re.search(r"^CVD=[0-3]$", output, re.M), output
    assert "GREETING=it's $(id) `x`" in output
    assert CI_USER in output


def test_cancel_running_job(gateway, ci_association, ci_user, job_dir, cleanup_jobs):
    since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    job_id = gateway.submit(_job(ci_association, ci_user, job_dir, script="#!/bin/bash\nsleep 300\n", gpus=0))
    cleanup_jobs.append(job_id)
    gateway.cancel(job_id)

    def cancelled():
        entry = _queue_entry(gateway, job_id)
        if entry is not None:
            return entry.state == "CANCELLED"
        record = _accounting_record(gateway, job_id, since)
        return record is not None and record.state == "CANCELLED"

    wait_for(cancelled, what="CANCELLED")
    gateway.cancel(job_id)  # cancelling an ended job is not an error


def test_unknown_partition_rejected_with_slurms_words(gateway, ci_association, ci_user, job_dir):
    with pytest.raises(SlurmRejected) as info:
        gateway.submit(_job(ci_association, ci_user, job_dir, script="#!/bin/bash\ntrue\n", partition="nope"))
    assert "invalid partition" in info.value.message.lower()


def test_time_limit_over_partition_max_rejected(gateway, ci_association, ci_user, job_dir):
    with pytest.raises(SlurmRejected):
        gateway.submit(_job(ci_association, ci_user, job_dir, script="#!/bin/bash\ntrue\n", partition="debug",
                            time_limit_minutes=9999))  # fmt: skip


def test_a_script_that_is_a_path_is_submitted_as_text(gateway, ci_association, ci_user, job_dir):
    """The job script is text, never a file name: pyslurm's ``script`` reads a file when given a path,
    so a "script" naming a file the portal (root) can read must not become that file's content."""
    target = job_dir / "not-my-script.sh"
    target.write_text("#!/bin/bash\necho LEAKED\n")
    with pytest.raises(SlurmRejected):  # "/tmp/.../not-my-script.sh" is no batch script (no #!)
        gateway.submit(_job(ci_association, ci_user, job_dir, script=str(target)))


def test_times_do_not_depend_on_the_host_zone(gateway, ci_association, ci_user, job_dir, cleanup_jobs, monkeypatch):
    """Slurm's times reach the portal as UTC whatever the host's zone (the CLI runs with TZ=UTC,
    pyslurm answers timestamps): submit and end times of a job just run are now, not hours off."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
        job_id = gateway.submit(_job(ci_association, ci_user, job_dir, script="#!/bin/bash\ntrue\n", gpus=0))
        cleanup_jobs.append(job_id)
        entry = _queue_entry(gateway, job_id)
        assert entry is not None and abs(entry.submit_time - dt.datetime.now(dt.UTC)) < dt.timedelta(minutes=2)
        record = wait_for(lambda: (r := _accounting_record(gateway, job_id, since)) and r.end_time and r,
                          what="the accounting record")  # fmt: skip
        assert abs(record.submit_time - dt.datetime.now(dt.UTC)) < dt.timedelta(minutes=2)
        assert abs(record.end_time - dt.datetime.now(dt.UTC)) < dt.timedelta(minutes=2)
    finally:
        monkeypatch.undo()
        time.tzset()


# --- reservations ------------------------------------------------------------------------------


def test_reservation_of_gpu_counts_where_slurm_can(gateway, ci_association):
    """25.11 reserves GPU counts (bookings use it); 22.05 refuses them, and the gateway says so."""
    name = f"gpuportal_ci_{uuid.uuid4().hex[:8]}"
    start = (dt.datetime.now(dt.UTC) + dt.timedelta(days=3)).replace(microsecond=0)
    spec = ReservationSpec(name=name, start=start, end=start + dt.timedelta(hours=1), accounts=(ci_association,),
                           tres={"gres/gpu:a100": 2})  # fmt: skip
    if not gateway.reservations_support_gpu_counts:
        assert slurm.same_release(gateway.version(), "22.05")
        with pytest.raises(SlurmRejected):
            gateway.reservation_create(spec)
        return
    try:
        assert gateway.reservation_create(spec) == name
        resv = {r.name: r for r in gateway.reservation_list()}[name]
        assert "gres/gpu:a100=2" in resv.tres.split(","), resv.tres
        assert resv.accounts == (ci_association,) and resv.nodes.startswith("a100-")
    finally:
        gateway.reservation_delete(name)
    assert name not in {r.name for r in gateway.reservation_list()}


def test_reservation_whole_node_create_list_delete(gateway, ci_association):
    name = f"gpuportal_ci_{uuid.uuid4().hex[:8]}"
    start = (dt.datetime.now(dt.UTC) + dt.timedelta(days=2)).replace(microsecond=0)
    spec = ReservationSpec(
        name=name, start=start, end=start + dt.timedelta(hours=1), accounts=(ci_association,),
        nodes=("h100-01",), flags=("IGNORE_JOBS",),
    )  # fmt: skip
    try:
        assert gateway.reservation_create(spec) == name
        listed = {r.name: r for r in gateway.reservation_list()}
        resv = listed[name]
        assert resv.accounts == (ci_association,)
        assert resv.nodes == "h100-01"
        assert resv.start == start and resv.end == start + dt.timedelta(hours=1)
        assert resv.state == "INACTIVE"
    finally:
        gateway.reservation_delete(name)
    assert name not in {r.name for r in gateway.reservation_list()}
    gateway.reservation_delete(name)  # deleting a missing reservation is fine


# --- controller down (last: it stops slurmctld for a few seconds) ------------------------------


def test_controller_down_raises_unavailable_within_timeout(settings, gateway, slurm_target):
    timeout = 5
    settings.SLURM_TIMEOUT = timeout
    slurm.reset_gateway()
    short = slurm.get_gateway()
    cluster = [str(REPO / "scripts" / "cluster")]
    subprocess.run([*cluster, "ctld-stop", *slurm_target.cluster_args], check=True, timeout=60, capture_output=True)
    try:
        for call in (short.queue, short.ping, short.partitions):
            started = time.monotonic()
            with pytest.raises(SlurmUnavailable):
                call()
            assert time.monotonic() - started < timeout + 2
    finally:
        subprocess.run([*cluster, "ctld-start", *slurm_target.cluster_args], check=True, timeout=120, capture_output=True)
    wait_for(lambda: _answers(short), what="slurmctld back")


def _answers(gateway) -> bool:
    try:
        return gateway.ping()
    except SlurmUnavailable:
        return False
