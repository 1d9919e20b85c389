"""Unix accounts on the submit host: jobs run as the submitter's Unix user (sbatch --uid/--gid).

The portal creates Unix users only for its own (local) accounts. An account that belongs to a
directory — a profile whose ``identity_source`` is LDAP or OIDC (set at each directory login), or
every account when ``UNIX_USERS_FROM_DIRECTORY=1`` — must resolve through NSS (SSSD, nslcd) and is
never ``useradd``-ed: a local copy would shadow the directory's uid on this host."""

from __future__ import annotations

import grp
import pwd
import subprocess

from django.conf import settings
from django.db.models import Q

from portal.exceptions import ApplicationError
from portal.models import UNIX_NAME_VALIDATOR, IdentitySource, Profile


def unix_ids(username: str) -> tuple[int, int] | None:
    """(uid, gid) of a Unix user, or None when the user does not exist on this host."""
    try:
        entry = pwd.getpwnam(username)
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def unix_account_problem(username: str, ids: tuple[int, int] | None, profile: Profile | None) -> str | None:
    """Why jobs may not run as this Unix user on this host (``ids`` from ``unix_ids``), or None. A
    directory user whose uid here is not the directory's would run as someone else's account."""
    if ids is None:
        return f"The Unix user {username!r} does not exist on the submit host; ask an admin to create it."
    if profile is not None and profile.directory_owned and profile.unix_uid is not None and ids[0] != profile.unix_uid:
        return (
            f"The Unix user {username!r} has uid {ids[0]} on the submit host but {profile.unix_uid} in the directory; "
            "jobs are refused until NSS/SSSD agrees with the directory."
        )
    return None


def unix_user_directory_owned(username: str) -> bool:
    """Does a directory own this Unix user name (see the module docstring)?"""
    if settings.UNIX_USERS_FROM_DIRECTORY:
        return True
    return (
        Profile.objects.exclude(identity_source=IdentitySource.LOCAL)
        .filter(Q(unix_username=username) | Q(unix_username="", user__username=username))
        .exists()
    )


def unix_user_ensure(username: str) -> tuple[int, int]:
    """Create the Unix user (with a home directory and its own group) when missing. Needs root.
    Refuses (ApplicationError) to create one that a directory owns."""
    UNIX_NAME_VALIDATOR(username)
    ids = unix_ids(username)
    if ids is not None:
        return ids
    if unix_user_directory_owned(username):
        raise ApplicationError(
            f"The Unix user {username!r} belongs to the directory and does not resolve on this host; "
            "the portal does not create directory users (check SSSD/nslcd).",
            errors={"unix_username": [f"{username} is not known to this host's NSS."]},
            status_code=409,
        )
    subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/bash", username], check=True, timeout=30)
    ids = unix_ids(username)
    assert ids is not None, f"useradd did not create {username}"
    return ids


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
