"""PyslurmGateway against a FAKE pyslurm module (tests/slurm/fake_pyslurm.py).

pyslurm 25.11 needs libslurm 25.11 and cannot be built on this project's Slurm 22.05 machines; the
fake mimics only the 25.11 API the backend uses, so these tests check the mapping of pyslurm
objects to typed values and of pyslurm.RPCError to SlurmUnavailable / SlurmRejected."""

from __future__ import annotations

import datetime as dt
import importlib.util
import sys
import time
from pathlib import Path

import pytest

from portal.slurm.types import JobSpec, ReservationSpec, SlurmRejected, SlurmUnavailable


@pytest.fixture
def fake_pyslurm(monkeypatch):
    spec = importlib.util.spec_from_file_location("fake_pyslurm", Path(__file__).with_name("fake_pyslurm.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "pyslurm", module)
    module.STATE.reset()
    return module


@pytest.fixture
def gateway(fake_pyslurm):
    from portal.slurm.pyslurm import PyslurmGateway

    return PyslurmGateway(cluster="gpuportal", timeout=2)


def _spec(**overrides):
    base = {"script": "#!/bin/bash\necho hi\n", "account": "vision", "partition": "gpu"}
    return JobSpec(**{**base, **overrides})


def test_submit_maps_spec_to_job_submit_description(gateway, fake_pyslurm):
    job_id = gateway.submit(
        _spec(
            name="x;rm -rf /", gpus=4, nodes=2, gpu_type="a100", cpus_per_gpu=2, memory_mb=4096,
            time_limit_minutes=90, workdir="/scratch", stdout="/tmp/o-%j", stderr="/tmp/e-%j",
            comment="gpuportal:abc", reservation="resv1", uid=1001, gid=1002, environment={"A": "it's"},
        )
    )  # fmt: skip
    assert job_id == 100
    (sent,) = fake_pyslurm.STATE.submitted
    assert sent["gres_per_node"] == {"gpu:a100": 2}  # per node; "gpu:<type>" keys (see backend)
    assert sent["cpus_per_gpu"] == 2
    assert sent["memory_per_node"] == 4096
    assert sent["time_limit"] == "90"
    assert sent["partitions"] == "gpu" and sent["nodes"] == 2
    assert sent["name"] == "x;rm -rf /" and sent["comment"] == "gpuportal:abc"
    assert (sent["user_id"], sent["group_id"]) == (1001, 1002)
    assert sent["reservations"] == "resv1"
    assert (sent["standard_output"], sent["standard_error"], sent["working_directory"]) == ("/tmp/o-%j", "/tmp/e-%j", "/scratch")
    assert sent["environment"] == "NONE"
    # The script reached pyslurm as a file path (never as content it might treat as a path) ...
    assert sent["script"].startswith("/") and sent["script"].endswith(".sh")
    assert not Path(sent["script"]).exists()  # ... removed after submitting
    assert sent["script_text"] == "#!/bin/bash\n# Environment set by gpuportal\nexport A='it'\"'\"'s'\necho hi\n"


def test_submit_untyped_gpus(gateway, fake_pyslurm):
    gateway.submit(_spec(gpus=2))
    assert fake_pyslurm.STATE.submitted[0]["gres_per_node"] == {"gpu": 2}


def test_submit_rejection(gateway, fake_pyslurm):
    fake_pyslurm.STATE.error = fake_pyslurm.RPCError(2000, "Invalid partition name specified")
    with pytest.raises(SlurmRejected, match="Invalid partition name"):
        gateway.submit(_spec(partition="nope"))


def test_pyslurm_value_error_is_rejected(gateway, fake_pyslurm):
    fake_pyslurm.STATE.error = ValueError("Batch script contains DOS line breaks")
    with pytest.raises(SlurmRejected, match="DOS"):
        gateway.submit(_spec())


@pytest.mark.parametrize(
    ("errno", "msg"),
    [(1800, "Unable to contact slurm controller (connect failure)"), (5004, "Socket timed out on send/recv operation"),
     (111, "Connection refused"), (9999, "Unable to contact slurm controller")],
)  # fmt: skip
def test_unreachable_controller_is_unavailable(gateway, fake_pyslurm, errno, msg):
    fake_pyslurm.STATE.error = fake_pyslurm.RPCError(errno, msg)
    with pytest.raises(SlurmUnavailable):
        gateway.queue()


def test_hanging_call_times_out(gateway, fake_pyslurm):
    fake_pyslurm.STATE.delay = 5
    started = time.monotonic()
    with pytest.raises(SlurmUnavailable, match="within 2 s"):
        gateway.partitions()
    assert time.monotonic() - started < 3


def test_queue_maps_jobs(gateway, fake_pyslurm):
    submit = int(dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.UTC).timestamp())
    fake_pyslurm.STATE.jobs = {
        12: fake_pyslurm.Job(
            12, name="train", user_name="alice", state="RUNNING", comment="gpuportal:abc", allocated_nodes="a100-02",
            submit_time=submit, start_time=submit + 5, end_time=submit + 3605, time_limit=60,
            gres_per_node={"gpu:a100": 2}, reservation="resv1",
        ),
        13: fake_pyslurm.Job(13, state="PENDING", state_reason="AssocGrpGRES", time_limit="UNLIMITED",
                             gres_per_node={"gpu:h100": {"count": "1", "indexes": "0"}}),
    }  # fmt: skip
    entries = {entry.job_id: entry for entry in gateway.queue()}
    running = entries[12]
    assert (running.state, running.comment, running.nodes) == ("RUNNING", "gpuportal:abc", "a100-02")
    assert running.submit_time == dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.UTC)
    assert running.tres_per_node == "gres:gpu:a100:2" and running.reservation == "resv1"
    assert running.time_limit_minutes == 60
    pending = entries[13]
    assert (pending.reason, pending.nodes, pending.start_time, pending.time_limit_minutes) == ("AssocGrpGRES", "", None, None)
    assert pending.tres_per_node == "gres:gpu:h100:1"
    assert gateway.find_by_comment("gpuportal:abc") == 12


def test_cancel_finished_job_is_fine(gateway, fake_pyslurm):
    gateway.cancel(12)
    assert fake_pyslurm.STATE.cancelled == [12]
    fake_pyslurm.STATE.error = fake_pyslurm.RPCError(2021, "Job/step already completing or completed")
    gateway.cancel(12)
    fake_pyslurm.STATE.error = fake_pyslurm.RPCError(2002, "Access/permission denied")
    with pytest.raises(SlurmRejected, match="denied"):
        gateway.cancel(12)


def test_partitions_and_nodes(gateway, fake_pyslurm):
    fake_pyslurm.STATE.partitions = {
        "gpu": fake_pyslurm.Partition("gpu", is_default=True, default_time=60, max_time=4320, nodes="a100-[01-02],h100-01"),
        "debug": fake_pyslurm.Partition("debug", default_time=10, max_time=60, nodes="a100-[01-02],h100-01"),
        "long": fake_pyslurm.Partition("long", default_time="UNLIMITED", max_time="UNLIMITED", state="DOWN"),
    }  # fmt: skip
    parts = {p.name: p for p in gateway.partitions()}
    assert parts["gpu"].is_default and parts["gpu"].max_time_minutes == 4320
    assert parts["gpu"].nodes == ("a100-01", "a100-02", "h100-01")
    assert parts["long"].max_time_minutes is None and parts["long"].nodes == ()
    fake_pyslurm.STATE.nodes = {
        "a100-01": fake_pyslurm.Node("a100-01", state="MIXED", configured_gres={"gpu:a100": 4},
                                     allocated_gres={"gpu:a100": {"count": "2", "indexes": "0-1"}}, allocated_cpus=4,
                                     partitions=["gpu", "debug"]),
        "h100-01": fake_pyslurm.Node("h100-01", state="IDLE+DRAIN", configured_gres={"gpu:h100": 4}, reason="maint"),
    }  # fmt: skip
    nodes = {n.name: n for n in gateway.nodes()}
    assert (nodes["a100-01"].gpu_type, nodes["a100-01"].gpus_total, nodes["a100-01"].gpus_allocated) == ("a100", 4, 2)
    assert nodes["a100-01"].partitions == ("gpu", "debug") and nodes["a100-01"].cpus_allocated == 4
    assert not nodes["h100-01"].available and nodes["h100-01"].reason == "maint"


def test_reservations(gateway, fake_pyslurm):
    start = dt.datetime(2026, 12, 1, 9, tzinfo=dt.UTC)
    spec = ReservationSpec(name="r1", start=start, end=start + dt.timedelta(hours=2), accounts=("vision",),
                           nodes=("h100-01",), flags=("IGNORE_JOBS", "MAINT"))  # fmt: skip
    assert gateway.reservation_create(spec) == "r1"
    created = fake_pyslurm.STATE.reservations["r1"]
    assert created.nodes == "h100-01" and created.accounts == ["vision"]
    assert created.start_time == int(start.timestamp())
    assert created.flags == fake_pyslurm.ReservationFlags.IGNORE_RUNNING_JOBS | fake_pyslurm.ReservationFlags.MAINTENANCE
    created.tres = {"cpu": 32}
    (listed,) = gateway.reservation_list()
    assert (listed.name, listed.start, listed.nodes, listed.tres, listed.state) == ("r1", start, "h100-01", "cpu=32", "INACTIVE")
    gateway.reservation_delete("r1")
    gateway.reservation_delete("r1")  # missing = success
    with pytest.raises(SlurmRejected, match="Unknown reservation flags"):
        gateway.reservation_create(ReservationSpec(name="r2", start=start, end=start, accounts=(), nodes=("x",),
                                                   flags=("BOGUS",)))  # fmt: skip


def test_gpu_tres_reservation_passed_to_pyslurm(gateway, fake_pyslurm):
    start = dt.datetime(2026, 12, 1, 9, tzinfo=dt.UTC)
    gateway.reservation_create(ReservationSpec(name="r3", start=start, end=start + dt.timedelta(hours=1),
                                               accounts=("vision",), tres={"gres/gpu:a100": 2}))  # fmt: skip
    assert fake_pyslurm.STATE.reservations["r3"].tres == {"gres/gpu:a100": 2}


def test_ping(gateway, fake_pyslurm):
    assert gateway.ping() is True
    fake_pyslurm.STATE.error = fake_pyslurm.RPCError(1800, "Unable to contact slurm controller (connect failure)")
    with pytest.raises(SlurmUnavailable):
        gateway.ping()


def test_accounting_and_associations_use_the_cli(gateway, monkeypatch):
    calls = []
    monkeypatch.setattr(gateway._cli, "accounting", lambda start, end, job_ids=None: calls.append(("accounting", job_ids)) or [])
    monkeypatch.setattr(gateway._cli, "account_add", lambda *a, **k: calls.append("account_add"))
    now = dt.datetime.now(dt.UTC)
    assert gateway.accounting(now, now) == []
    assert gateway.accounting(now, now, job_ids={7}) == []
    gateway.account_add("vision")
    assert calls == [("accounting", None), ("accounting", {7}), "account_add"]
