"""Quotas in the real local Slurm cluster: an approved quota becomes GrpTRESMins / GrpTRES on the
team's account (read back through the gateway and through sacctmgr itself), and a direct sbatch
beyond the GPU cap pends with reason AssocGrpGRES. A fresh random team/account per test."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid

import pytest
from django.conf import settings

from accounting import services
from portal.models import Membership, Role
from portal.services import team_create, team_mirror
from portal.slurm import SlurmError, get_gateway, reset_gateway
from portal.unix import unix_user_ensure
from tests.factories import UserFactory
from tests.support import skip_unless_ci, slurm_job, wait_for

pytestmark = [pytest.mark.django_db, pytest.mark.slurm]


@pytest.fixture
def fresh_team(world):
    """A new team with its own Slurm account and one manager with a Unix account, mirrored to Slurm."""
    reset_gateway()
    gateway = get_gateway()
    try:
        gateway.ping()
    except SlurmError as exc:
        skip_unless_ci(f"local Slurm cluster not reachable: {exc}")
    account = "q" + uuid.uuid4().hex[:10]
    team = team_create(name=account, slug=account, slurm_account=account)  # on_commit not run: mirrored below
    user = UserFactory(username="u" + account[1:8])
    unix_user_ensure(user.username)
    Membership.objects.create(team=team, user=user, role=Role.MANAGER)
    team_mirror(team=team)
    job_ids: list[int] = []
    yield team, user, gateway, job_ids
    for job_id in job_ids:
        gateway.cancel(job_id)
    wait_for(lambda: not [e for e in gateway.queue() if e.job_id in job_ids and e.state in ("RUNNING", "PENDING", "COMPLETING")], timeout=30)
    with contextlib.suppress(SlurmError):  # leftovers of a random account harm nobody
        gateway.user_remove(user.username, account)
        gateway.account_remove(account)


def _sacctmgr_limits(account: str) -> list[str]:
    env = dict(os.environ)
    if settings.SLURM_CONF:
        env["SLURM_CONF"] = settings.SLURM_CONF
    out = subprocess.run(
        ["sacctmgr", "-n", "-P", "show", "assoc", f"account={account}", "format=User,GrpTRESMins,GrpTRES"],
        capture_output=True, text=True, check=True, env=env, timeout=30,
    )  # fmt: skip
    return [line for line in out.stdout.splitlines() if line.startswith("|")]  # the account's own row (no user)


def test_approved_quota_is_mirrored_to_the_association(fresh_team, django_capture_on_commit_callbacks):
    team, manager, gateway, _ = fresh_team
    admin = UserFactory(username="qadmin", is_staff=True)
    quota = services.quota_request(team=team, user=manager, gpu_hours=10, max_gpus=2, justification="t")
    typed = services.quota_request(team=team, user=manager, gpu_hours=4, gpu_type="a100", justification="t")
    with django_capture_on_commit_callbacks(execute=True):
        services.quota_approve(quota=quota, user=admin)
        services.quota_approve(quota=typed, user=admin)
    limits = gateway.association_limits_get(team.slurm_account)
    assert limits.grp_tres_mins == {"gres/gpu": 600, "gres/gpu:a100": 240}
    assert limits.grp_tres == {"gres/gpu": 2}
    [row] = _sacctmgr_limits(team.slurm_account)
    _, mins, tres = row.split("|")
    assert set(mins.split(",")) == {"gres/gpu=600", "gres/gpu:a100=240"}
    assert tres == "gres/gpu=2"
    assert services.quota_limit_drift() == [] or all(team.slurm_account not in line for line in services.quota_limit_drift())


def test_direct_sbatch_beyond_the_gpu_cap_pends_with_AssocGrpGRES(fresh_team, django_capture_on_commit_callbacks):
    from portal.unix import unix_ids

    team, manager, gateway, job_ids = fresh_team
    admin = UserFactory(username="qadmin", is_staff=True)
    quota = services.quota_request(team=team, user=manager, gpu_hours=100, max_gpus=1, justification="t")
    with django_capture_on_commit_callbacks(execute=True):
        services.quota_approve(quota=quota, user=admin)
    uid, gid = unix_ids(manager.username)
    for n in range(2):
        job_ids.append(gateway.submit(slurm_job(script="#!/bin/bash\nsleep 60\n", account=team.slurm_account, partition="gpu",
                                              name=f"cap-{n}", gpus=1, time_limit_minutes=5, uid=uid, gid=gid)))  # fmt: skip

    def states():
        by_id = {e.job_id: e for e in gateway.queue() if e.job_id in job_ids}
        first, second = by_id.get(job_ids[0]), by_id.get(job_ids[1])
        if first and second and first.state == "RUNNING" and second.state == "PENDING" and second.reason == "AssocGrpGRES":
            return first, second
        return None

    _, second = wait_for(states, timeout=30)
    assert second.reason == "AssocGrpGRES"
