"""Where a job is submitted from: the submitter's own directory, as under sbatch on a login node.

- ``default_submit_dir``: the per-user default, ``JOB_DEFAULT_WORKDIR`` with placeholders (``{home}``,
  the default; ``/scratch/{user}``, ``/home/{user}/gpuportal/{job}``), used when the request names no
  directory (the CLI sends the directory it runs in, as sbatch takes its own). The job starts there
  unless ``--chdir`` says otherwise, its SLURM_SUBMIT_DIR is it, relative ``--chdir``/``--output``
  are resolved against it, and the portal's output files are written in the job's working directory
  (never a shared /tmp with predictable names).
- ``submit_dir_ensure``: the relay (root, in the Celery worker) creates a missing directory AS THE
  USER (``mkdir`` run with the user's uid, gid and groups): the kernel allows exactly what the user
  could do in a login shell, so a symlink another user planted cannot make root create or chown
  anything. The default directory must then be the user's own real directory (not a symlink, owned
  by the user): one another user created first is refused.
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import uuid

from django.conf import settings

from portal.exceptions import ApplicationError
from portal.slurm import SlurmRejected

def cluster_username(user) -> str:
    """The Unix name jobs of ``user`` run as (the profile's cluster username, else the login name)."""
    profile = getattr(user, "profile", None)
    return profile.cluster_username if profile else user.username


def user_home(username: str) -> str:
    """The user's home directory in this host's passwd database (/home/<user> when the host does not
    know the user: the relay then refuses the job, having no Unix account to run it as)."""
    try:
        return pwd.getpwnam(username).pw_dir
    except KeyError:
        return os.path.join("/home", username)


def default_submit_dir(*, user, team, job_id: uuid.UUID) -> str:
    """The job's default submit directory: JOB_DEFAULT_WORKDIR for this user, team and job."""
    username = cluster_username(user)
    home = user_home(username) if "{home}" in settings.JOB_DEFAULT_WORKDIR else ""
    path = settings.JOB_DEFAULT_WORKDIR.format(user=username, home=home, team=getattr(team, "slug", ""), job=job_id)
    if "/../" in f"{path}/" or "\x00" in path:
        raise ApplicationError("The default working directory is invalid for this user.",
                               errors={"submit_dir": [f"{path!r} is not a plain absolute path."]})  # fmt: skip
    return os.path.normpath(path)


def submit_dir_ensure(path: str, *, username: str, ids: tuple[int, int] | None, default: bool) -> None:
    """Make sure the job's submit directory exists (the relay, before submitting): a missing one is
    created as the user (``ids``: its uid and gid; None: as this process, SLURM_SUBMIT_AS_USER off).
    ``default``: the path is the user's default, which must be the user's own directory. Raises
    SlurmRejected (the job is SUBMIT_FAILED with the reason) when it cannot be."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise SlurmRejected(f"The submit directory {path} cannot be read: {exc.strerror}") from None
    if info is None:
        if not default:
            raise SlurmRejected(f"The submit directory {path} does not exist on the submit host.")
        _mkdir_as(path, username=username, ids=ids)
        info = os.lstat(path)
    if not default:
        return
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise SlurmRejected(f"The default working directory {path} is not a directory (a symlink or a file); not used.")
    if ids is not None and info.st_uid != ids[0]:
        raise SlurmRejected(f"The default working directory {path} belongs to uid {info.st_uid}, not to {username}; not used.")


def _mkdir_as(path: str, *, username: str, ids: tuple[int, int] | None) -> None:
    """``mkdir -p -m 0700 PATH`` as the user (no shell; the user's own groups)."""
    kwargs = {}
    if ids is not None and os.geteuid() == 0:
        uid, gid = ids
        kwargs = {"user": uid, "group": gid, "extra_groups": os.getgrouplist(username, gid)}
    try:
        done = subprocess.run(["mkdir", "-p", "-m", "0700", "--", path], capture_output=True, text=True, timeout=30,
                              cwd="/", env={"PATH": "/usr/bin:/bin", "LANG": "C"}, check=False, **kwargs)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        raise SlurmRejected(f"The default working directory {path} cannot be created: {exc}") from None
    if done.returncode:
        reason = done.stderr.strip().removeprefix("mkdir: ") or f"mkdir exited with {done.returncode}"
        raise SlurmRejected(f"The default working directory {path} cannot be created as {username}: {reason}")
