"""Unix accounts on the submit host: jobs run as the submitter's Unix user (sbatch --uid/--gid)."""

from __future__ import annotations

import grp
import pwd
import subprocess

from portal.models import UNIX_NAME_VALIDATOR


def unix_ids(username: str) -> tuple[int, int] | None:
    """(uid, gid) of a Unix user, or None when the user does not exist on this host."""
    try:
        entry = pwd.getpwnam(username)
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def unix_user_ensure(username: str) -> tuple[int, int]:
    """Create the Unix user (with a home directory and its own group) when missing. Needs root."""
    UNIX_NAME_VALIDATOR(username)
    ids = unix_ids(username)
    if ids is not None:
        return ids
    subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/bash", username], check=True, timeout=30)
    ids = unix_ids(username)
    assert ids is not None, f"useradd did not create {username}"
    return ids


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
