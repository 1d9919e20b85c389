"""Bookings against the real local clusters: on Slurm 22.05 whole-node reservations, on 25.11
GPU-count reservations (``TRES=gres/gpu:a100=2``; cli and pyslurm), and with both clusters served a
booking on 25.11 reserved there only. A fresh random team/account and Unix user, a 10-minute window
starting now, reservations deleted in teardown."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import subprocess
import uuid

import pytest
from django.conf import settings
from django.utils import timezone
from rest_framework.test import APIClient

from accounting.models import Booking, BookingStatus, ReservationState
from accounting.services import booking_cancel, booking_create
from jobs.services import job_submit
from portal.exceptions import Conflict
from portal.models import Role, TeamClusterAccount
from portal.slurm import ClusterConfig, SlurmError, configured_clusters, get_gateway
from tests.factories import MembershipFactory, QuotaFactory, TeamFactory, UserFactory
from tests.support import cluster_env, skip_unless_ci, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]


def slurm(command: str, *argv: str) -> str:
    """One Slurm command of the cluster the settings point at (its SLURM_CONF and bin dir)."""
    return slurm_of(settings.SLURM_CONF, settings.SLURM_BIN_DIR, command, *argv)


def slurm_of(conf: str, bin_dir: str, command: str, *argv: str) -> str:
    """One Slurm command of the cluster of that slurm.conf and bin dir (empty: the environment's)."""
    env = {**os.environ, **({"SLURM_CONF": conf} if conf else {})}
    exe = os.path.join(bin_dir, command) if bin_dir else command
    return subprocess.run([exe, *argv], capture_output=True, text=True, env=env, timeout=30, check=False).stdout


@pytest.fixture
def fresh_team(cluster):
    from portal.services import team_mirror
    from portal.unix import unix_user_ensure

    suffix = uuid.uuid4().hex[:6]
    team = TeamFactory(slug=f"bk{suffix}", name=f"Booking {suffix}", slurm_account=f"bk{suffix}")
    manager = UserFactory(username=f"bkm{suffix}")
    MembershipFactory(team=team, user=manager, role=Role.MANAGER)
    QuotaFactory(team=team, gpu_hours=1000)  # bookings count against the budget (QUOTA_NO_QUOTA_POLICY=blocked)
    unix_user_ensure(manager.username)
    team_mirror(team=team)
    created: list[str] = []
    yield team, manager, created
    slurm("scancel", "-A", team.slurm_account)  # a reservation with jobs in it cannot be deleted
    for name in created:
        wait_for(lambda: _deleted(name), timeout=30, interval=0.5)


def _deleted(name: str) -> bool:
    from portal.slurm import SlurmRejected

    try:
        get_gateway().reservation_delete(name)
    except SlurmRejected:
        return False
    return True


def _book_a100_now(fresh_team, gpus: int, capture):
    """A booking of ``gpus`` a100 GPUs for the next 10 minutes, its reservation made (on commit)."""
    team, manager, created = fresh_team
    start = timezone.now()
    end = start + dt.timedelta(minutes=10)
    with capture(execute=True):
        booking = booking_create(team=team, gpu_type="a100", gpus=gpus, start=start, end=end, actor=manager)
    created.append(booking.reservation_name)
    booking.refresh_from_db()
    return booking, start, end


def test_booking_becomes_a_reservation_jobs_run_in_it_and_cancel_removes_it(fresh_team, django_capture_on_commit_callbacks):
    team, manager, _ = fresh_team
    booking, start, end = _book_a100_now(fresh_team, 4, django_capture_on_commit_callbacks)
    assert booking.status == BookingStatus.APPROVED
    assert booking.reservation_state == ReservationState.ACTIVE, booking.reservation_error
    assert len(booking.nodes) == 1

    shown = slurm("scontrol", "show", "reservation", booking.reservation_name, "-o")
    assert f"ReservationName={booking.reservation_name}" in shown
    assert f"Accounts={team.slurm_account}" in shown and f"Nodes={booking.nodes[0]}" in shown
    assert booking.reservation_name in {r.name for r in get_gateway().reservation_list()}

    # a conflicting booking (more a100 GPUs than are left in the window) is refused
    with pytest.raises(Conflict) as info:
        booking_create(team=team, gpu_type="a100", gpus=8, start=start, end=end, actor=manager)
    assert "a100: 4 of 8 GPUs already booked" in info.value.message

    with django_capture_on_commit_callbacks(execute=True):
        job, _ = job_submit(user=manager, team=team, name="in-booking", script="#!/bin/bash\nsleep 4\n",
                            partition="gpu", gpu_type="a100", gpus=4, time_limit_minutes=5, booking=booking.pk)  # fmt: skip
    job.refresh_from_db()
    assert job.slurm_job_id, job.last_relay_error
    # squeue shows the reservation while the job runs (on the booked node)
    running = wait_for(lambda: (out if (out := slurm("squeue", "-h", "-j", str(job.slurm_job_id), "-o", "%T|%v|%N").strip()).startswith("RUNNING") else None), timeout=30, interval=0.2)
    assert running.split("|")[1:] == [booking.reservation_name, booking.nodes[0]], running

    def finished():
        out = slurm("sacct", "-j", str(job.slurm_job_id), "-X", "-n", "-P", "-o", "State,ReservationId,NodeList")
        fields = out.strip().split("|")
        # right after the end, slurmdbd may not have filled every field yet: wait for the id too
        return out.strip() if fields[0] == "COMPLETED" and len(fields) > 1 and fields[1] else None

    # sacct 22.05 leaves the Reservation name empty but keeps the reservation's id (sacctmgr show reservation)
    state, reservation_id, nodes = wait_for(finished, timeout=60, interval=0.5).split("|")[:3]
    ids = dict(line.split("|")[:2] for line in slurm("sacctmgr", "-n", "-P", "show", "reservation", "format=Name,Id").splitlines() if "|" in line)
    assert reservation_id == ids[booking.reservation_name] and nodes == booking.nodes[0]

    with django_capture_on_commit_callbacks(execute=True):
        booking_cancel(booking=booking, actor=manager)
    booking.refresh_from_db()
    assert booking.reservation_state == ReservationState.DELETED
    assert booking.reservation_name not in slurm("scontrol", "show", "reservation", "-o")
    assert booking.reservation_name not in {r.name for r in get_gateway().reservation_list()}


@pytest.mark.parametrize("slurm_target", [("cli", "25.11"), ("pyslurm", "25.11")], ids=["cli-25.11", "pyslurm-25.11"],
                         indirect=True)  # fmt: skip
def test_on_slurm_25_11_a_booking_reserves_a_gpu_count_and_a_job_runs_in_it(slurm_target, fresh_team,
                                                                            django_capture_on_commit_callbacks):
    team, manager, _ = fresh_team
    booking, _, _ = _book_a100_now(fresh_team, 2, django_capture_on_commit_callbacks)
    assert booking.reservation_state == ReservationState.ACTIVE, booking.reservation_error
    assert booking.nodes in ([], None), "25.11 reserves GPUs, not whole nodes"
    shown = slurm("scontrol", "show", "reservation", booking.reservation_name, "-o")
    assert "gres/gpu:a100=2" in shown and f"Accounts={team.slurm_account}" in shown, shown

    with django_capture_on_commit_callbacks(execute=True):
        job, _ = job_submit(user=manager, team=team, name="in-gpu-booking", script="#!/bin/bash\nsleep 2\n",
                            partition="gpu", gpu_type="a100", gpus=2, time_limit_minutes=5, booking=booking.pk)  # fmt: skip
    job.refresh_from_db()
    assert job.slurm_job_id, job.last_relay_error
    running = wait_for(lambda: (out if (out := slurm("squeue", "-h", "-j", str(job.slurm_job_id), "-o", "%T|%v|%b").strip()).startswith(("RUNNING", "COMPLETING")) else None), timeout=30, interval=0.2)  # fmt: skip
    assert running.split("|")[1] == booking.reservation_name, running
    # a reservation with a job in it cannot be deleted: let the 2-second job end first
    wait_for(lambda: not slurm("squeue", "-h", "-j", str(job.slurm_job_id), "-t", "R,CG").strip(), timeout=60, interval=0.3)

    with django_capture_on_commit_callbacks(execute=True):
        booking_cancel(booking=booking, actor=manager)
    booking.refresh_from_db()
    assert booking.reservation_state == ReservationState.DELETED, booking.reservation_error
    assert booking.reservation_name not in {r.name for r in get_gateway().reservation_list()}


# ---------------------------------------------------------------- both clusters served


@pytest.fixture
def both_clusters_served(settings, cluster):
    """22.05 (the default) and 25.11 served by one portal (cli), both inventories read. Skips (fails
    under CI) when the 25.11 cluster is not built or not up."""
    import portal.slurm as slurm_package
    from portal.services import cluster_sync, clusters_record

    env25 = cluster_env("25.11")
    settings.GPUPORTAL_CLUSTERS = (
        ClusterConfig(settings.SLURM_CLUSTER, "cli", settings.SLURM_CONF, settings.SLURM_BIN_DIR),
        ClusterConfig(env25["SLURM_CLUSTER"], "cli", env25["SLURM_CONF"], env25["SLURM_BIN_DIR"]),
    )  # fmt: skip
    slurm_package.reset_gateway()
    try:
        get_gateway(env25["SLURM_CLUSTER"]).ping()
    except SlurmError as exc:
        skip_unless_ci(f"Slurm 25.11 cluster {env25['SLURM_CLUSTER']} not reachable (scripts/cluster up --slurm 25.11): {exc}")
    clusters_record()
    for config in configured_clusters():
        cluster_sync(cluster=config.name)
    yield env25
    slurm_package.reset_gateway()


def test_a_booking_on_the_25_11_cluster_is_reserved_there_only(both_clusters_served, fresh_team,
                                                               django_capture_on_commit_callbacks):  # fmt: skip
    from portal.services import cluster_row, team_mirror

    env25 = both_clusters_served
    name25 = env25["SLURM_CLUSTER"]
    team, manager, _ = fresh_team
    TeamClusterAccount.objects.create(team=team, cluster=cluster_row(name25), slurm_account=team.slurm_account)
    team_mirror(team=team)  # its account and association on 25.11 too
    client = APIClient()
    client.force_authenticate(user=manager)
    start = timezone.now()
    payload = {"team": team.slug, "cluster": name25, "gpu_type": "a100", "gpus": 2, "start": start.isoformat(),
               "end": (start + dt.timedelta(minutes=10)).isoformat()}  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post("/api/v1/bookings/", payload, format="json")
    assert answer.status_code == 201, answer.json()
    booking = Booking.objects.get(pk=answer.json()["id"])
    try:
        assert answer.json()["cluster"] == name25 and booking.cluster.name == name25
        assert booking.reservation_state == ReservationState.ACTIVE, booking.reservation_error
        shown = slurm_of(env25["SLURM_CONF"], env25["SLURM_BIN_DIR"], "scontrol", "show", "reservation", booking.reservation_name, "-o")
        assert f"ReservationName={booking.reservation_name}" in shown, shown
        assert "gres/gpu:a100=2" in shown and f"Accounts={team.slurm_account}" in shown, shown
        # not on the default cluster (its gateway raises when it cannot tell)
        assert booking.reservation_name not in {r.name for r in get_gateway(settings.SLURM_CLUSTER).reservation_list()}

        with django_capture_on_commit_callbacks(execute=True):
            booking_cancel(booking=booking, actor=manager)
        booking.refresh_from_db()
        assert booking.reservation_state == ReservationState.DELETED, booking.reservation_error
        assert booking.reservation_name not in {r.name for r in get_gateway(name25).reservation_list()}
    finally:
        with contextlib.suppress(SlurmError):  # gone already: not an error
            get_gateway(name25).reservation_delete(booking.reservation_name)
