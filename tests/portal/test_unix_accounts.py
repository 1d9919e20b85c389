"""Unix accounts jobs run as: a directory user's uid on the submit host must be the directory's,
else jobs are refused before they reach Slurm (they would run as someone else's account)."""

from __future__ import annotations

import pytest

from jobs.services import _submission_for
from portal.models import IdentitySource, Profile
from portal.slurm import SlurmRejected
from portal.unix import unix_account_problem, unix_ids
from tests.security.test_url_matrix import make_job

pytestmark = pytest.mark.django_db


def _directory_profile(user, *, unix_username: str, uid: int | None) -> Profile:
    Profile.objects.filter(user=user).update(identity_source=IdentitySource.LDAP, unix_username=unix_username, unix_uid=uid)
    return Profile.objects.get(user=user)


def test_a_directory_uid_that_differs_from_the_hosts_is_a_problem(world):
    root = unix_ids("root")
    assert unix_account_problem("root", root, _directory_profile(world.alice, unix_username="root", uid=0)) is None
    problem = unix_account_problem("root", root, _directory_profile(world.alice, unix_username="root", uid=24001))
    assert "uid 0 on the submit host but 24001 in the directory" in problem
    assert unix_account_problem("root", root, _directory_profile(world.alice, unix_username="root", uid=None)) is None
    assert "does not exist on the submit host" in unix_account_problem("no-such-user", None, None)
    local = Profile.objects.get(user=world.bob)  # a local account: the host's uid is the truth
    assert unix_account_problem("root", root, local) is None


def test_the_relay_refuses_a_job_of_a_mismatched_directory_user(world, settings):
    settings.SLURM_SUBMIT_AS_USER = True
    _directory_profile(world.alice, unix_username="root", uid=24001)
    job = make_job(world.vision, world.alice)
    job.submitter.refresh_from_db()
    with pytest.raises(SlurmRejected, match="24001 in the directory"):
        _submission_for(job)
