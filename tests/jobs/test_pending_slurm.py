"""Issue 40 against the real local clusters: what the sync stores of a pending job (expected start,
place in line, the reason) is what Slurm itself says — ``squeue --start`` for the start, squeue's own
priority sort for the place, ``%r`` for the reason — for a job behind a running one, behind the
team's GPU cap, behind a reservation, held, deferred, dependent, in a reservation not started yet.

The jobs are Job rows whose Slurm jobs carry their tags (submitted through the gateway, bypassing
the relay for speed); every one is cancelled and every reservation and account removed afterwards."""

from __future__ import annotations

import contextlib
import datetime as dt
import subprocess
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job
from jobs.pending import reason_code, reason_explained
from jobs.services import jobs_sync
from portal.models import Membership, Role
from portal.services import team_create, team_mirror
from portal.slurm import SlurmError, get_gateway
from portal.slurm import parsing
from portal.slurm.cli import _clean_env
from portal.slurm.types import AssociationLimits, ReservationSpec
from portal.unix import unix_ids
from tests.support import wait_for, slurm_job

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]


def slurm(command: str, *args: str) -> str:
    """One of Slurm's own commands on the cluster under test (the oracle), its stdout."""
    exe = str(Path(settings.SLURM_BIN_DIR) / command) if settings.SLURM_BIN_DIR else command
    done = subprocess.run([exe, *args], capture_output=True, text=True, env=_clean_env(settings.SLURM_CONF), timeout=30)
    assert done.returncode == 0, (command, args, done.stderr)
    return done.stdout


def squeue_start(slurm_ids) -> dict[int, dt.datetime | None]:
    """``squeue --start``: each pending job's expected start (None: N/A)."""
    out = slurm("squeue", "--start", "-h", "-j", ",".join(map(str, slurm_ids)), "-o", "%i|%S")
    return {int(i): parsing.parse_time(start) for i, start in (line.split("|") for line in out.split())}


def squeue_places(partition: str, gpu_type: str) -> list[int]:
    """The pending jobs of a partition wanting one GPU type, in squeue's own priority sort."""
    out = slurm("squeue", "-h", "-t", "PENDING", "-p", partition, "--sort=-p,i", "-o", "%i|%b|%P")
    ids = []
    for line in out.splitlines():
        job_id, tres, partitions = line.split("|")
        wanted = parsing.tres_per_node(tres).split(":")
        if partitions.split(",")[0] == partition and (wanted[2] if len(wanted) > 3 else "") == gpu_type:
            ids.append(int(job_id))
    return ids


def squeue_reasons(slurm_ids) -> dict[int, str]:
    out = slurm("squeue", "-h", "-j", ",".join(map(str, slurm_ids)), "-o", "%i|%r")
    return {int(i): reason for i, reason in (line.split("|", 1) for line in out.splitlines())}


@pytest.fixture
def slurm_jobs(cluster, fresh_teams, reservations):
    """submit(...) -> a Job row in PENDING whose Slurm job carries its tag; all cancelled afterwards,
    before the fresh teams' accounts and the reservations go (Slurm keeps a reservation a job waits in)."""
    gateway = get_gateway()
    uid, gid = unix_ids("alice")
    submitted: list[int] = []

    def submit(*, name: str, gpus: int, gpu_type: str, minutes: int, team=None, directives=(), partition="gpu") -> Job:
        team = team or cluster.vision
        script = "#!/bin/bash\n" + "".join(f"#SBATCH {d}\n" for d in directives) + "sleep 3000\n"
        job = Job.objects.create(
            team=team, submitter=cluster.alice, name=name, script=script, partition=partition, gpu_type=gpu_type,
            gpus=gpus, time_limit_minutes=minutes, workdir="/tmp", state=JobState.PENDING, estimated_gpu_hours=1,
        )  # fmt: skip
        spec = slurm_job(script, account=team.slurm_account, partition=partition, name=name, gpus=gpus,
                       gpu_type=gpu_type, time_limit_minutes=minutes, comment=job.slurm_tag, uid=uid, gid=gid)  # fmt: skip
        slurm_id = gateway.submit(spec)
        submitted.append(slurm_id)
        Job.objects.filter(pk=job.pk).update(slurm_job_id=slurm_id, slurm_cluster=settings.SLURM_CLUSTER, submitted_at=timezone.now())
        job.refresh_from_db()
        return job

    yield submit
    for slurm_id in submitted:
        with contextlib.suppress(SlurmError):
            gateway.cancel(slurm_id)


# The accounts these tests give their teams: fixed names, kept in Slurm between runs. An account
# that ran a job stays in sreport's answers after ``sacctmgr delete`` (measured on 22.05), and the
# gateway's contract test holds sreport's accounts to those that exist: so they are never removed.
TEST_ACCOUNTS = ("p40a", "p40b", "p40c")


@pytest.fixture
def fresh_teams(cluster):
    """team(cap=None) -> a new team (alice a member) on the next of TEST_ACCOUNTS, capped at ``cap``
    GPUs (GrpTRES gres/gpu; no cap: cleared); its jobs waited for afterwards (never the account:
    see TEST_ACCOUNTS)."""
    gateway = get_gateway()
    accounts: list[str] = []

    def team(cap: int | None = None):
        account = TEST_ACCOUNTS[len(accounts)]
        made = team_create(name=account, slug=account, slurm_account=account)
        Membership.objects.create(team=made, user=cluster.alice, role=Role.MEMBER)
        team_mirror(team=made)
        gateway.association_limits_set(AssociationLimits(account=account, grp_tres={"gres/gpu": cap} if cap is not None else {}))
        accounts.append(account)
        return made

    yield team
    wait_for(lambda: not [e for e in gateway.queue() if e.account in accounts and e.state in ("PENDING", "RUNNING", "COMPLETING")],
             timeout=30, what="the test accounts' jobs to go")  # fmt: skip


@pytest.fixture
def capped_team(fresh_teams):
    """A team on its own account capped at one GPU: GrpTRES gres/gpu=1."""
    return fresh_teams(cap=1)


@pytest.fixture
def qos_limits(cluster):
    """qos(account, limit) -> a new QOS with that limit ("MaxTRESPerUser=gres/gpu=1"), allowed to the
    account (sacctmgr: the gateway manages no QOS); deleted afterwards."""
    names: list[str] = []

    def qos(account: str, limit: str) -> str:
        name = "p40" + uuid.uuid4().hex[:8]
        slurm("sacctmgr", "-i", "add", "qos", name, f"set", limit)
        names.append(name)
        slurm("sacctmgr", "-i", "modify", "account", account, "set", f"qos+={name}")
        return name

    yield qos
    for name in names:
        slurm("sacctmgr", "-i", "delete", "qos", name)


@pytest.fixture
def reservations(cluster):
    """reserve(node, start, minutes, accounts) -> a whole-node reservation's name; deleted afterwards."""
    gateway = get_gateway()
    names: list[str] = []

    def reserve(node: str, start: dt.datetime, minutes: int, accounts: tuple[str, ...]) -> str:
        name = "p40-" + uuid.uuid4().hex[:8]
        spec = ReservationSpec(name=name, start=start, end=start + dt.timedelta(minutes=minutes), accounts=accounts, nodes=(node,))
        names.append(gateway.reservation_create(spec))
        return names[-1]

    yield reserve
    for name in names:
        gateway.reservation_delete(name)


_last_sync: dict = {}


def _synced(jobs) -> list[Job]:
    _last_sync.clear()
    _last_sync.update(jobs_sync())  # its figures (an "error" when squeue failed) for a failure's message
    return [Job.objects.get(pk=j.pk) for j in jobs]


def test_expected_start_and_place_are_what_squeue_start_says(slurm_target, slurm_jobs, capped_team, reservations, counting_gateway):
    running = slurm_jobs(name="ahead", gpus=4, gpu_type="h100", minutes=30)  # all of h100-01
    wait_for(lambda: _synced([running])[0].state == JobState.RUNNING, timeout=60, what="the first h100 job to run")
    behind = slurm_jobs(name="behind-running", gpus=4, gpu_type="h100", minutes=10)
    second = slurm_jobs(name="second-in-line", gpus=2, gpu_type="h100", minutes=10)
    capped_first = slurm_jobs(name="cap-1", gpus=1, gpu_type="a100", minutes=5, team=capped_team)
    capped = slurm_jobs(name="cap-2", gpus=1, gpu_type="a100", minutes=5, team=capped_team)
    # h100-01 reserved for another account from 45 to 105 minutes from now: a 60-minute job cannot
    # fit between the running job's end and the reservation
    soon = (timezone.now() + dt.timedelta(minutes=45)).replace(microsecond=0)
    reserved = reservations("h100-01", soon, 60, (capped_team.slurm_account,))
    after_reservation = slurm_jobs(name="behind-reservation", gpus=1, gpu_type="h100", minutes=60)
    pending = [behind, second, capped, after_reservation]
    ids = [j.slurm_job_id for j in pending]

    counting_gateway.calls.clear()
    cycles = 0

    def agrees():
        nonlocal cycles
        cycles += 1
        synced = _synced(pending)
        oracle = squeue_start(ids)
        places = {gpu_type: squeue_places("gpu", gpu_type) for gpu_type in ("h100", "a100")}
        stored = {j.slurm_job_id: j.expected_start_at for j in synced}
        # the reasons too: Slurm gives a new pending job its reason when its scheduler has looked at it,
        # not when it is queued (25.11, CI 2026-12-07: the start time already agreed and "behind" had no
        # reason yet); the sync stores what squeue says at that moment
        ok = (
            stored == oracle and synced[0].expected_start_at is not None and synced[3].expected_start_at is not None
            and synced[2].state_reason == "AssocGrpGRES"
            and (synced[0].state_reason, synced[1].state_reason) == ("Resources", "Priority")
            and all(j.queue_position == places[j.gpu_type].index(j.slurm_job_id) + 1 for j in synced)
        )  # fmt: skip
        return (synced, oracle, places) if ok else None

    synced, oracle, places = wait_for(agrees, timeout=90, interval=1, what="the stored outlook to match squeue --start")
    behind, second, capped, after_reservation = synced
    assert counting_gateway.calls["queue"] == cycles and set(counting_gateway.calls) <= {"queue", "accounting"}
    # behind the running job: it starts when that one's time limit ends (Slurm's plan, to the second)
    ahead = next(e for e in get_gateway().queue() if e.job_id == running.slurm_job_id)
    assert behind.expected_start_at == ahead.end_time
    assert behind.state_reason == "Resources" and reason_explained(behind.state_reason) is not None
    assert behind.queue_position < second.queue_position  # the older job, same priority, first
    assert second.state_reason == "Priority" and reason_explained(second.state_reason) is not None  # behind "behind"
    # behind the reservation: not before it ends
    (resv,) = [r for r in get_gateway().reservation_list() if r.name == reserved]
    assert after_reservation.expected_start_at >= resv.end
    # behind the team's cap: in words, with what to do about it; placed among the pending a100 jobs
    assert reason_explained(capped.state_reason).code == "AssocGrpGRES" and capped.queue_position >= 1
    print(f"\n{slurm_target}: squeue --start {oracle}; h100 line {places}; capped {capped.expected_start_at}")


def test_each_pending_reason_slurm_gives_is_stored_and_explained(slurm_target, slurm_jobs, capped_team, fresh_teams, reservations):
    if slurm_target.backend != "cli":
        pytest.skip("the reasons are Slurm's, not the backend's: the cli backend on each cluster is enough")
    # held before they can start: Slurm holds a RUNNING job too (22.05 and 25.11: it keeps running, squeue's
    # reason JobHeldAdmin), and a job sent to free GPUs may start between its sbatch and the hold; a
    # held job's reason is the hold's, whatever its begin time
    not_yet = ["--begin=now+2hours"]
    held_user = slurm_jobs(name="held-user", gpus=1, gpu_type="a100", minutes=5, directives=not_yet)
    held_admin = slurm_jobs(name="held-admin", gpus=1, gpu_type="a100", minutes=5, directives=not_yet)
    slurm("scontrol", "uhold", str(held_user.slurm_job_id))
    slurm("scontrol", "hold", str(held_admin.slurm_job_id))
    later = slurm_jobs(name="begin", gpus=1, gpu_type="a100", minutes=5, directives=["--begin=now+2hours"])
    dependent = slurm_jobs(name="dependency", gpus=1, gpu_type="a100", minutes=5,
                           directives=[f"--dependency=afterok:{held_admin.slurm_job_id}"])  # fmt: skip
    start = (timezone.now() + dt.timedelta(hours=3)).replace(microsecond=0)
    booking = reservations("a100-02", start, 30, (held_user.team.slurm_account,))
    in_reservation = slurm_jobs(name="reservation", gpus=1, gpu_type="a100", minutes=5, directives=[f"--reservation={booking}"])
    slurm_jobs(name="cap-1", gpus=1, gpu_type="a100", minutes=5, team=capped_team)
    capped = slurm_jobs(name="cap-2", gpus=1, gpu_type="a100", minutes=5, team=capped_team)
    # a node the job asks for is reserved for another account (a node that does not exist cannot be
    # asked for: sbatch -w and scontrol update ReqNodeList refuse it, "Invalid node name specified")
    reservations("h100-01", timezone.now().replace(microsecond=0), 30, (fresh_teams().slurm_account,))
    no_node = slurm_jobs(name="no-node", gpus=1, gpu_type="h100", minutes=5, directives=["--nodelist=h100-01"])
    expected = {
        held_user: "JobHeldUser", held_admin: "JobHeldAdmin", later: "BeginTime", dependent: "Dependency",
        in_reservation: "Reservation", capped: "AssocGrpGRES", no_node: "ReqNodeNotAvail",
    }  # fmt: skip
    ids = [j.slurm_job_id for j in expected]

    def stored():
        synced = {j.slurm_job_id: j for j in _synced(list(expected))}
        oracle = squeue_reasons(ids)
        codes = {expected_code: reason_code(synced[j.slurm_job_id].state_reason) for j, expected_code in expected.items()}
        same = all(synced[i].state_reason == oracle[i] for i in ids)
        seen[:] = [oracle]
        return (synced, oracle) if same and all(code == got for code, got in codes.items()) else None

    seen: list = []
    try:
        synced, oracle = wait_for(stored, timeout=90, interval=1, what=f"the reasons {sorted(expected.values())}")
    except BaseException:
        ours = {j.slurm_job_id: (code, j.name) for j, code in expected.items()}
        stored_now = {
            j.slurm_job_id: (j.state, j.state_reason) for j in Job.objects.filter(pk__in=[j.pk for j in expected])
        }
        pytest.fail(
            f"wanted {ours}; Slurm said {seen[-1] if seen else None}; the portal stored {stored_now}; "
            f"the last jobs_sync said {_last_sync}"
        )
    for job_id, job in synced.items():
        explained = reason_explained(job.state_reason)
        assert explained is not None and explained.text, job.state_reason  # every one of them in the table
    # a deferred job's expected start is its --begin time, as squeue --start says
    assert synced[later.slurm_job_id].expected_start_at == squeue_start([later.slurm_job_id])[later.slurm_job_id]
    print(f"\n{slurm_target}: {oracle}")


def test_the_qos_gpu_limits_are_stored_and_explained(slurm_target, qos_limits, slurm_jobs, fresh_teams):
    # qos_limits first: set up before the jobs, it is torn down after they are gone (Slurm keeps a QOS
    # that jobs still use)
    if slurm_target.backend != "cli":
        pytest.skip("the reasons are Slurm's, not the backend's: the cli backend on each cluster is enough")
    team = fresh_teams()
    per_user = qos_limits(team.slurm_account, "MaxTRESPerUser=gres/gpu=1")
    group = qos_limits(team.slurm_account, "GrpTRES=gres/gpu=1")
    expected = {}
    for qos, code in ((per_user, "QOSMaxGRESPerUser"), (group, "QOSGrpGRES")):
        slurm_jobs(name=f"{code}-1", gpus=1, gpu_type="a100", minutes=5, team=team, directives=[f"--qos={qos}"])
        expected[slurm_jobs(name=f"{code}-2", gpus=1, gpu_type="a100", minutes=5, team=team, directives=[f"--qos={qos}"])] = code
    ids = [j.slurm_job_id for j in expected]

    def stored():
        synced = {j.slurm_job_id: j for j in _synced(list(expected))}
        oracle = squeue_reasons(ids)
        same = all(synced[j.slurm_job_id].state_reason == oracle[j.slurm_job_id] and reason_code(oracle[j.slurm_job_id]) == code
                   for j, code in expected.items())  # fmt: skip
        return synced if same else None

    synced = wait_for(stored, timeout=60, interval=1, what=f"the reasons {sorted(expected.values())}")
    assert all(reason_explained(job.state_reason) is not None for job in synced.values())
