"""Teams are Slurm accounts: creating a team, adding and removing members and deactivating a team
are mirrored to Slurm's associations (real local cluster); slurm_reconcile reports and fixes drift."""

from __future__ import annotations

import io
import uuid

import pytest
from django.core.management import call_command

from portal import services
from portal.models import Membership, Role
from portal.slurm import get_gateway, reset_gateway
from tests.factories import UserFactory

pytestmark = [pytest.mark.django_db, pytest.mark.slurm]


@pytest.fixture
def gateway():
    reset_gateway()
    return get_gateway()


@pytest.fixture
def account():
    return "t" + uuid.uuid4().hex[:10]


def _users_in(gateway, account: str) -> set[str]:
    return {a.user for a in gateway.associations() if a.account == account and a.user}


def _accounts(gateway) -> set[str]:
    return {a.account for a in gateway.associations() if not a.user}


def test_team_lifecycle_is_mirrored_to_slurm_associations(gateway, account, django_capture_on_commit_callbacks):
    user1 = UserFactory(username="u" + account[1:8])
    user2 = UserFactory(username="v" + account[1:8])
    with django_capture_on_commit_callbacks(execute=True):
        team = services.team_create(name=account, slug=account, slurm_account=account)
    assert account in _accounts(gateway)

    with django_capture_on_commit_callbacks(execute=True):
        services.membership_set(team=team, user=user1, role=Role.MEMBER)
        services.membership_set(team=team, user=user2, role=Role.MANAGER)
    assert _users_in(gateway, account) == {user1.username, user2.username}
    defaults = {a.user: a.account for a in gateway.associations() if a.user and a.is_default}
    assert defaults.get(user1.username) == account

    with django_capture_on_commit_callbacks(execute=True):
        services.membership_remove(team=team, user=user2)
    assert _users_in(gateway, account) == {user1.username}

    # Running the mirror again changes nothing and raises nothing ("already exists" = success).
    assert services.team_mirror(team=team) == []

    with django_capture_on_commit_callbacks(execute=True):
        services.team_set_active(team=team, active=False)
    assert _users_in(gateway, account) == set()
    assert account in _accounts(gateway)  # the account stays, for accounting history


def test_slurm_reconcile_prints_differences_and_apply_fixes_only_managed_accounts(gateway, account):
    unmanaged = "x" + account[1:]
    gateway.account_add(unmanaged, description="not the portal's")
    gateway.user_add("nobody", unmanaged, default=True)
    team = services.team_create(name=account, slug=account, slurm_account=account)  # no on_commit: not mirrored
    user = UserFactory(username="w" + account[1:8])
    Membership.objects.create(team=team, user=user, role=Role.MEMBER)

    out = io.StringIO()
    call_command("slurm_reconcile", stdout=out)
    text = out.getvalue()
    assert f"account {account} is missing in Slurm" in text
    assert f"user {user.username} is missing from account {account}" in text
    assert unmanaged not in text
    assert account not in _accounts(gateway)  # report only

    call_command("slurm_reconcile", "--apply", stdout=io.StringIO())
    assert _users_in(gateway, account) == {user.username}
    assert _users_in(gateway, unmanaged) == {"nobody"}  # never touched

    # A user added behind the portal's back is reported as extra, and removed by --apply.
    gateway.user_add("intruder", account)
    out = io.StringIO()
    call_command("slurm_reconcile", stdout=out)
    assert f"user intruder is in account {account} but not in the team" in out.getvalue()
    call_command("slurm_reconcile", "--apply", stdout=io.StringIO())
    assert _users_in(gateway, account) == {user.username}
    out = io.StringIO()
    call_command("slurm_reconcile", stdout=out)
    assert account not in out.getvalue()

