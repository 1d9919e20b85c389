"""The bench world: team ``gpbench`` mirrored to Slurm, its member ``gpbench`` with a Unix account
and a fresh API token, an unlimited quota, the inventory synced. Made through the portal's services."""

from __future__ import annotations

import os
from dataclasses import dataclass
from unittest import mock

from environment import BENCH_TEAM, BENCH_USER, BENCH_WORKDIR


@dataclass
class World:
    team: object
    user: object
    token: str
    uid: int
    gid: int


def world(*, slurm: bool = True) -> World:
    """Team ``gpbench`` mirrored to Slurm (account + association), its member ``gpbench`` with a Unix
    account and a fresh API token, the inventory synced. Through the portal's services; idempotent.
    ``slurm=False``: the portal side only (benchmarks that never call Slurm)."""
    from django.contrib.auth import get_user_model

    from portal.models import ApiToken, Team
    from portal.roles import is_member
    from portal.services import api_token_create, cluster_sync, membership_set, team_create, team_mirror
    from portal.unix import unix_user_ensure

    uid, gid = unix_user_ensure(BENCH_USER)
    if slurm:
        cluster_sync()
    team = Team.objects.filter(slug=BENCH_TEAM).first()
    if team is None:
        with mock.patch("portal.services.after_commit", lambda *args: None):  # mirrored below
            team = team_create(
                name="Benchmarks",
                slug=BENCH_TEAM,
                slurm_account=BENCH_TEAM,
                description="gpuportal benchmarks",
            )
    user, _ = get_user_model().objects.get_or_create(username=BENCH_USER)
    if not is_member(user, team):
        with mock.patch("portal.services.after_commit", lambda *args: None):
            membership_set(team=team, user=user)
    if slurm:
        team_mirror(team=team)
    _unlimited_quota(team)
    ApiToken.objects.filter(user=user).delete()
    _, key = api_token_create(user=user, name="bench")
    os.makedirs(BENCH_WORKDIR, exist_ok=True)
    os.chmod(BENCH_WORKDIR, 0o1777)
    return World(team=team, user=user, token=key, uid=uid, gid=gid)


def _unlimited_quota(team) -> None:
    """An approved quota far larger than any benchmark, so submissions measure the portal, not the budget
    check's refusal (the check itself still runs). Stored directly: not mirrored to Slurm limits."""
    import datetime as dt

    from django.utils import timezone

    from accounting.models import Quota, QuotaState

    today = timezone.localdate()
    Quota.objects.get_or_create(
        team=team,
        gpu_type="",
        period_start=today - dt.timedelta(days=366),
        period_end=today + dt.timedelta(days=366),
        state=QuotaState.APPROVED,
        defaults={"gpu_hours": 10**8, "approved_at": timezone.now(), "justification": "benchmarks"},
    )
