"""PyslurmGateway's error mapping, on a FAKE pyslurm that fails on demand (tests/slurm/fake_pyslurm.py):
pyslurm.RPCError -> SlurmUnavailable / SlurmRejected, ValueError -> SlurmRejected, a hanging libslurm
call -> SlurmUnavailable after the timeout. Everything else the backend does is proven against the
real Slurm 25.11 cluster by tests/slurm/test_gateway_contract.py."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

from tests.support import slurm_job
from portal.slurm.types import JobSubmission, SlurmRejected, SlurmUnavailable


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

    # a slurm.conf that does not exist: no controller address to pre-check, only the fake answers
    return PyslurmGateway(cluster="gpuportal", timeout=2, slurm_conf="/nonexistent/slurm.conf")


def _spec(**overrides):
    base = {"script": "#!/bin/bash\necho hi\n", "account": "vision", "partition": "gpu"}
    return slurm_job(**{**base, **overrides})


def test_submit_rejection(gateway, fake_pyslurm):
    fake_pyslurm.STATE.error = fake_pyslurm.RPCError(2000, "Invalid partition name specified")
    with pytest.raises(SlurmRejected, match="Invalid partition name"):
        gateway.submit(_spec(partition="nope"))


def test_what_pyslurm_cannot_express_is_submitted_by_the_cli(gateway, monkeypatch):
    """pyslurm_request.NotExpressible (here --hint): the cli backend submits the job, nothing else does."""
    by_cli: list[JobSubmission] = []
    monkeypatch.setattr(gateway._cli, "submit", lambda spec: by_cli.append(spec) or 42)
    hinted = _spec(script="#!/bin/bash\n#SBATCH --hint=nomultithread\necho hi\n")
    assert gateway.submit(hinted) == 42 and by_cli == [hinted]
    assert gateway.submit(_spec(script="#!/bin/bash\n#SBATCH -t 5\necho hi\n")) != 42 and by_cli == [hinted]


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


def test_cancel_finished_job_is_fine(gateway, fake_pyslurm):
    fake_pyslurm.STATE.error = fake_pyslurm.RPCError(2021, "Job/step already completing or completed")
    gateway.cancel(12)
    fake_pyslurm.STATE.error = fake_pyslurm.RPCError(2002, "Access/permission denied")
    with pytest.raises(SlurmRejected, match="denied"):
        gateway.cancel(12)


def test_ping(gateway, fake_pyslurm):
    assert gateway.ping() is True
    fake_pyslurm.STATE.error = fake_pyslurm.RPCError(1800, "Unable to contact slurm controller (connect failure)")
    with pytest.raises(SlurmUnavailable):
        gateway.ping()


def test_deleting_a_missing_reservation_is_fine(gateway, fake_pyslurm):
    fake_pyslurm.STATE.error = fake_pyslurm.RPCError(2048, "Requested reservation is invalid")
    gateway.reservation_delete("r1")
    fake_pyslurm.STATE.error = fake_pyslurm.RPCError(1800, "Unable to contact slurm controller (connect failure)")
    with pytest.raises(SlurmUnavailable):
        gateway.reservation_delete("r1")


def test_controller_addresses_from_slurm_conf(tmp_path):
    from portal.slurm.pyslurm import controller_addresses

    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=c\nSlurmctldHost=vm(127.0.0.1)  # primary\nslurmctldhost=backup\nSlurmctldPort=6917-6918\n")
    assert controller_addresses(str(conf)) == [("127.0.0.1", 6917), ("backup", 6917)]
    conf.write_text("SlurmctldHost=ctl\n")
    assert controller_addresses(str(conf)) == [("ctl", 6817)]
    assert controller_addresses(str(tmp_path / "missing.conf")) == []


def test_the_controller_is_probed_unless_it_answered_within_the_second(gateway, fake_pyslurm, monkeypatch):
    """A call probes slurmctld's port first (pyslurm would freeze the process on a stopped controller),
    except within PROBE_SKIP_AFTER_ANSWER_SECONDS of an answered call: a burst of submissions costs the
    controller one probe, not one each. An unavailable answer makes the next call probe again."""
    from portal.slurm import pyslurm as backend

    probes: list[float] = []
    monkeypatch.setattr(gateway, "_controller_answers", lambda: probes.append(time.monotonic()) or True)
    gateway.ping()
    gateway.ping()
    gateway.queue()
    assert len(probes) == 1  # the first call only
    monkeypatch.setattr(backend, "PROBE_SKIP_AFTER_ANSWER_SECONDS", 0.0)
    gateway.ping()
    assert len(probes) == 2  # the answer is older than the window
    monkeypatch.setattr(backend, "PROBE_SKIP_AFTER_ANSWER_SECONDS", 60.0)
    fake_pyslurm.STATE.error = fake_pyslurm.RPCError(1800, "Unable to contact slurm controller (connect failure)")
    with pytest.raises(SlurmUnavailable):
        gateway.ping()  # within the window: not probed, and unavailable
    assert len(probes) == 2
    fake_pyslurm.STATE.error = None
    gateway.ping()
    assert len(probes) == 3  # probed again after the unavailable answer
    monkeypatch.setattr(gateway, "_controller_answers", lambda: probes.append(time.monotonic()) and False)
    monkeypatch.setattr(backend, "PROBE_SKIP_AFTER_ANSWER_SECONDS", 0.0)
    with pytest.raises(SlurmUnavailable, match="does not accept connections"):
        gateway.ping()
