"""Slurm gateway backend that runs Slurm's own commands (sbatch, squeue, sacct, scontrol, sacctmgr).

Rules kept everywhere in this module:

- argv lists only, never a shell: every value (job name, comment, path, account) is one argv
  element, whatever characters it holds;
- a timeout on every call (``timeout`` seconds); a timeout raises ``SlurmUnavailable``;
- one command per method call (two for ``associations()`` and for ``user_add(default=True)``,
  which need the user table as well as the association table);
- the child's environment is ours plus ``SLURM_CONF``, ``SLURM_TIME_FORMAT=standard`` and
  ``TZ=UTC`` (Slurm prints and reads times in UTC: no ambiguous hour at a DST change), minus
  every ``SBATCH_*``/``SQUEUE_*``/``SACCT_*``/... variable that would silently change what the
  commands do (e.g. ``SQUEUE_USERS`` filters squeue).

Output formats were measured on Slurm 22.05.8; see ``_Quirks`` for the version-specific choices.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import re
import subprocess
import time
from collections.abc import Collection
from dataclasses import dataclass

from . import parsing
from . import types as t
from .base import SlurmGateway
from .cli_argv import (
    STEP_EXPORT,
    check_script,
    check_text,
    export_file_bytes,
    job_process_environment,
    sbatch_argv,
    sreport_argv,
    sreport_utilization_argv,
)
from .cli_output import (
    QUEUE_FIELDS,
    QUEUE_FORMAT,
    SACCT_FIELDS,
    limits_update,
    parse_account_qos,
    parse_assoc_mgr_qos,
    parse_associations,
    parse_job_id,
    parse_limits,
    parse_max_array_size,
    parse_nodes,
    parse_overrun_config,
    parse_partitions,
    parse_queue,
    parse_reservations,
    parse_sacct,
)
from .parsing import FIELD_SEP

# Re-exported: the argv builders (portal.slurm.cli_argv) and output parsers (portal.slurm.cli_output)
# are importable from here as before the split.
__all__ = [
    "QUEUE_FIELDS", "QUEUE_FORMAT", "SACCT_FIELDS", "CliGateway", "check_text", "is_idempotent_success",
    "limits_update", "parse_account_qos", "parse_assoc_mgr_qos", "parse_associations", "parse_job_id",
    "parse_limits", "parse_max_array_size", "parse_nodes", "parse_partitions",
    "parse_queue", "parse_reservations", "parse_sacct", "sbatch_argv", "sreport_argv", "submit_dir_of",
]  # fmt: skip

logger = logging.getLogger(__name__)

# Environment variables that change what Slurm's commands do; never inherited by them.
_SCRUBBED_ENV_PREFIXES = ("SBATCH_", "SQUEUE_", "SACCT_", "SINFO_", "SCANCEL_", "SCONTROL_", "SACCTMGR_", "SLURM_")


# ==============================================================================================
# Version-specific choices: the ONE place that knows how Slurm releases differ.
# ==============================================================================================
@dataclass(frozen=True)
class _Quirks:
    """What differs between the Slurm versions this backend talks to.

    Measured on 22.05.8 (Debian 12). Newer releases (Debian 13 ships 24.x) were not measured here:
    re-check squeue/sacct field output before trusting them."""

    version: str
    # 22.05 rejects TRES=gres/gpu=N in reservations ("not supported with reservations");
    # newer Slurm accepts them (pyslurm 25.11's own tests reserve TRES=cpu=2,gres/gpu=2).
    reservation_gpu_tres: bool

    @classmethod
    def for_version(cls, version: str) -> _Quirks:
        match = re.match(r"(\d+)\.(\d+)", version)
        major, minor = (int(match[1]), int(match[2])) if match else (0, 0)
        number = major * 100 + minor
        return cls(version=version, reservation_gpu_tres=number >= 2305)


# ==============================================================================================


def _clean_env(slurm_conf: str, lib_dir: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_ENV_PREFIXES)}
    conf = slurm_conf or os.environ.get("SLURM_CONF", "")
    if conf:
        env["SLURM_CONF"] = conf
    if lib_dir:  # the cluster's libslurm first (a Slurm built elsewhere than the system's)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (lib_dir, env.get("LD_LIBRARY_PATH", "")) if p)
    env["SLURM_TIME_FORMAT"] = "standard"  # 2024-05-01T12:34:56, in TZ's zone:
    env["TZ"] = "UTC"  # every time the gateway parses or sends (parsing.parse_time/format_time)
    return env


# --- the gateway -------------------------------------------------------------------------------


class CliGateway(SlurmGateway):
    name = "cli"

    def __init__(self, *, cluster: str, timeout: int, slurm_conf: str = "", bin_dir: str = "", lib_dir: str = ""):
        self.cluster = cluster
        self.timeout = timeout
        self.slurm_conf = slurm_conf
        self.bin_dir = bin_dir
        self._env = _clean_env(slurm_conf, lib_dir)

    # -- plumbing --------------------------------------------------------------------------------

    def _exe(self, name: str) -> str:
        return os.path.join(self.bin_dir, name) if self.bin_dir else name

    def _run(
        self, argv: list[str], *, stdin: str | None = None, ok_patterns: tuple[str, ...] = (), env: dict[str, str] | None = None,
        cwd: str | None = None, pass_fds: tuple[int, ...] = (),
    ) -> str:
        """Run one Slurm command; return its stdout or raise SlurmUnavailable / SlurmRejected.

        ``ok_patterns``: words that make a nonzero exit an idempotent success (e.g. sacctmgr's
        "Nothing new added." on stdout, with nothing on stderr)."""
        command = os.path.basename(argv[0])
        started = time.monotonic()
        try:
            proc = subprocess.run(
                argv,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                env=self._env if env is None else env,
                cwd=cwd,
                pass_fds=pass_fds,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise t.SlurmUnavailable(f"{command} did not answer within {self.timeout} s", command=command) from exc
        except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
            raise t.SlurmUnavailable(f"{command} cannot be run: {exc}", command=command) from exc
        elapsed_ms = (time.monotonic() - started) * 1000
        logger.debug("%s rc=%s in %.1f ms", command, proc.returncode, elapsed_ms)
        if proc.returncode == 0:
            return proc.stdout
        if ok_patterns and is_idempotent_success(proc.stdout, proc.stderr, ok_patterns):
            return proc.stdout
        raise parsing.classify_failure(
            returncode=proc.returncode, stderr=proc.stderr, stdout=proc.stdout, command=command
        )

    @functools.cached_property
    def _quirks(self) -> _Quirks:
        return _Quirks.for_version(self.version())

    # -- basics ----------------------------------------------------------------------------------

    def version(self) -> str:
        out = self._run([self._exe("sinfo"), "--version"])
        return out.strip().split()[-1] if out.strip() else ""

    def ping(self) -> bool:
        try:
            out = self._run([self._exe("scontrol"), "ping"])
        except t.SlurmRejected as exc:  # scontrol ping exits 1 when a controller is DOWN
            raise t.SlurmUnavailable(exc.message, command="scontrol") from exc
        if "is UP" not in out:
            raise t.SlurmUnavailable(out.strip() or "slurmctld is not responding", command="scontrol")
        return True

    # -- jobs ------------------------------------------------------------------------------------

    def submit(self, submission: t.JobSubmission) -> int:
        """``sbatch`` with the request's command line and its script on stdin, run as a submitter's
        shell would: in the submit directory (sbatch sets SLURM_SUBMIT_DIR from its own cwd), with
        SLURM_EXPORT_ENV=ALL (cli_argv.STEP_EXPORT) and the job's variables in a memory file passed
        as ``--export-file=<fd>`` (cli_argv.export_argv). The relay runs several at once
        (jobs.services.relay: RELAY_BATCH_THREADS)."""
        submit_dir = submit_dir_of(submission.request)
        # SLURM_TIME_FORMAT is for the gateway's parsers; sbatch would pass it on into the job
        env = {k: v for k, v in self._env.items() if k != "SLURM_TIME_FORMAT"} | STEP_EXPORT
        variables = export_file_bytes(job_process_environment(submission.request, submit_dir=submit_dir))
        fd = os.memfd_create("gpuportal-job-env", os.MFD_CLOEXEC)
        try:
            os.write(fd, variables)
            os.lseek(fd, 0, os.SEEK_SET)
            argv, script = self._sbatch_input(submission, export_fd=fd)
            return parse_job_id(self._run(argv, stdin=script, env=env, cwd=submit_dir, pass_fds=(fd,)))
        finally:
            os.close(fd)

    def _sbatch_input(self, submission: t.JobSubmission, export_fd: int = 3) -> tuple[list[str], str]:
        """What sbatch is run with: its argv and the request's script on its stdin (unchanged)."""
        return sbatch_argv(submission, self._exe("sbatch"), export_fd=export_fd), check_script(submission.request.script)

    def cancel(self, job_id: int) -> None:
        self._run([self._exe("scancel"), str(int(job_id))], ok_patterns=parsing.ALREADY_GONE_PATTERNS)

    def admin_comment_set(self, job_id: int, text: str) -> None:
        """``scontrol update JobId=N AdminComment=…`` (root or SlurmUser: the portal's own words; one
        argv item, no shell, so spaces are kept)."""
        argv = [self._exe("scontrol"), "update", f"JobId={int(job_id)}", f"AdminComment={text}"]
        self._run(argv, ok_patterns=parsing.ALREADY_GONE_PATTERNS)

    def cancel_array_task(self, array_job_id: int, index: int) -> None:
        self._run([self._exe("scancel"), f"{int(array_job_id)}_{int(index)}"], ok_patterns=parsing.ALREADY_GONE_PATTERNS)

    def queue(self) -> list[t.QueueEntry]:
        out = self._run([self._exe("squeue"), "-h", "-a", "-t", "all", "-o", QUEUE_FORMAT])
        return parse_queue(out)

    def accounting(
        self, start: dt.datetime, end: dt.datetime, *, job_ids: Collection[int] | None = None
    ) -> list[t.AccountingRecord]:
        # sacct takes whole seconds and -E T keeps jobs eligible before T, not at T (measured on 22.05 and
        # 25.11: a job eligible at 18:24:06 is missing with -E 18:24:06, there with -E 18:24:07). The window
        # is [start, end] with end's second in it: -E is the second after end's. Without it, a job that
        # became eligible in the second of a window's end (``end`` = now) was missing from that window.
        until = end.replace(microsecond=0) + dt.timedelta(seconds=1)
        argv = [
            self._exe("sacct"), "-X", "-a", "--parsable2", "--noheader", f"--delimiter={FIELD_SEP}",
            "-S", parsing.format_time(start), "-E", parsing.format_time(until),
            "-o", ",".join(SACCT_FIELDS),
        ]  # fmt: skip
        if job_ids is not None:
            if not job_ids:
                return []
            # -D: every record of each id, not only its latest — a controller that lost its state gives
            # an id again, and the record the caller wants may be the older one (a runaway's)
            argv += ["-D", "-j", ",".join(str(int(job_id)) for job_id in sorted(job_ids))]
        if self.cluster:
            argv += ["-M", self.cluster]
        return parse_sacct(self._run(argv))

    # -- inventory -------------------------------------------------------------------------------

    def partitions(self) -> list[t.Partition]:
        """``scontrol show partition -o``: the partitions with their limits (Partition.limits)."""
        return parse_partitions(self._run([self._exe("scontrol"), "show", "partition", "-o"]))

    def nodes(self) -> list[t.Node]:
        """``scontrol show node -o``: the nodes with their features (Node.features)."""
        return parse_nodes(self._run([self._exe("scontrol"), "show", "node", "-o"]))

    def policy(self) -> t.ClusterPolicy:
        """Three calls: the QOS slurmctld holds (``scontrol show assoc_mgr flags=qos``: 10 ms, where
        ``sacctmgr show qos`` asks slurmdbd), sacctmgr show assoc and scontrol show config. Node
        features and partition limits come with nodes() and partitions(): no second read of either."""
        qos = self._run([self._exe("scontrol"), "show", "assoc_mgr", "flags=qos"])
        assoc = self._sacctmgr("show", "assoc", f"cluster={self.cluster}", "format=Account,QOS")
        config = self._run([self._exe("scontrol"), "show", "config"])
        over_time, kill_wait = parse_overrun_config(config)
        return t.ClusterPolicy(
            qos=parse_assoc_mgr_qos(qos),
            account_qos=parse_account_qos(assoc),
            max_array_size=parse_max_array_size(config),
            over_time_limit_minutes=over_time,
            kill_wait_seconds=kill_wait,
        )

    # -- reservations ----------------------------------------------------------------------------

    @property
    def reservations_support_gpu_counts(self) -> bool:
        return self._quirks.reservation_gpu_tres

    def reservation_argv(self, spec: t.ReservationSpec) -> list[str]:
        check_text(spec.name, "Reservation name")
        argv = [
            self._exe("scontrol"), "create", "reservation",
            f"ReservationName={spec.name}",
            f"StartTime={parsing.format_time(spec.start)}",
            f"EndTime={parsing.format_time(spec.end)}",
            f"Accounts={','.join(spec.accounts)}",
        ]  # fmt: skip
        if spec.nodes:
            argv.append(f"Nodes={','.join(spec.nodes)}")
        elif spec.tres:
            gpu_keys = [key for key in spec.tres if key.startswith("gres/gpu")]
            if gpu_keys and not self._quirks.reservation_gpu_tres:
                raise t.SlurmRejected(
                    f"Slurm {self._quirks.version} cannot reserve GPU counts (TRES={parsing.format_tres(spec.tres)});"
                    " reserve whole nodes instead",
                    command="scontrol",
                )
            argv.append(f"TRES={parsing.format_tres(spec.tres)}")
        if spec.partition:
            argv.append(f"PartitionName={spec.partition}")
        if spec.flags:
            argv.append(f"Flags={','.join(spec.flags)}")
        return argv

    def reservation_create(self, spec: t.ReservationSpec) -> str:
        out = self._run(self.reservation_argv(spec))
        match = re.search(r"Reservation created:\s*(\S+)", out)
        return match[1] if match else spec.name

    def reservation_delete(self, name: str) -> None:
        check_text(name, "Reservation name")
        self._run(
            [self._exe("scontrol"), "delete", f"ReservationName={name}"],
            ok_patterns=parsing.RESERVATION_MISSING_PATTERNS,
        )

    def reservation_list(self) -> list[t.Reservation]:
        return parse_reservations(self._run([self._exe("scontrol"), "show", "reservation", "-o"]))

    # -- associations ----------------------------------------------------------------------------

    def _sacctmgr(self, *args: str, ok: bool = False) -> str:
        return self._run(
            [self._exe("sacctmgr"), "-i", "-n", "-P", *args],
            ok_patterns=parsing.NOTHING_TO_DO_PATTERNS if ok else (),
        )

    def runaway_jobs_fix(self) -> list[int]:
        out = self._sacctmgr("show", "runawayjobs", f"cluster={self.cluster}", "format=ID")
        # -n -P: a NOTE line, then one id per line; or "Runaway Jobs: No runaway jobs found on cluster …"
        return [int(line) for line in (line.strip() for line in out.splitlines()) if line.isdigit()]

    def associations(self) -> list[t.Association]:
        assoc = self._sacctmgr("show", "assoc", f"cluster={self.cluster}", "format=Cluster,Account,User,ParentName")
        users = self._sacctmgr("show", "user", "withassoc", f"cluster={self.cluster}", "format=User,DefaultAccount")
        return parse_associations(assoc, users)

    def account_add(self, account: str, *, description: str = "", parent: str = "") -> None:
        check_text(account, "Account")
        args = ["add", "account", account, f"Cluster={self.cluster}"]
        if description:
            args.append(f"Description={check_text(description, 'Description')}")
        if parent:
            args.append(f"Parent={check_text(parent, 'Parent account')}")
        self._sacctmgr(*args, ok=True)

    def account_remove(self, account: str) -> None:
        self._sacctmgr("remove", "account", "where", f"name={check_text(account, 'Account')}",
                       f"cluster={self.cluster}", ok=True)  # fmt: skip

    def user_add(self, user: str, account: str, *, default: bool = False) -> None:
        check_text(user, "User")
        check_text(account, "Account")
        args = ["add", "user", user, f"Account={account}", f"Cluster={self.cluster}"]
        if default:
            args.append(f"DefaultAccount={account}")
        self._sacctmgr(*args, ok=True)
        if default:
            # "add user" ignores DefaultAccount for a user who exists already.
            self._sacctmgr("modify", "user", "where", f"name={user}", f"cluster={self.cluster}",
                           "set", f"DefaultAccount={account}", ok=True)  # fmt: skip

    def user_remove(self, user: str, account: str) -> None:
        self._sacctmgr("remove", "user", "where", f"name={check_text(user, 'User')}",
                       f"account={check_text(account, 'Account')}", f"cluster={self.cluster}", ok=True)  # fmt: skip

    def association_limits_get(self, account: str) -> t.AssociationLimits:
        out = self._sacctmgr("show", "assoc", "where", f"account={check_text(account, 'Account')}",
                             f"cluster={self.cluster}", "format=Account,User,GrpTRESMins,GrpTRES")  # fmt: skip
        return parse_limits(account, out)

    def association_limits_set(self, limits: t.AssociationLimits) -> None:
        current = self.association_limits_get(limits.account)
        mins = limits_update(current.grp_tres_mins, limits.grp_tres_mins)
        tres = limits_update(current.grp_tres, limits.grp_tres)
        settings = []
        if mins:
            settings.append(f"GrpTRESMins={parsing.format_tres(mins)}")
        if tres:
            settings.append(f"GrpTRES={parsing.format_tres(tres)}")
        if not settings:
            return
        self._sacctmgr("modify", "account", "where", f"name={limits.account}", f"cluster={self.cluster}",
                       "set", *settings, ok=True)  # fmt: skip

    def account_usage_reset(self, account: str) -> None:
        self._sacctmgr("modify", "account", "where", f"name={check_text(account, 'Account')}",
                       f"cluster={self.cluster}", "set", "RawUsage=0", ok=True)  # fmt: skip

    # -- reports ---------------------------------------------------------------------------------

    def account_gpu_minutes(self, start: dt.datetime, end: dt.datetime) -> dict[str, int]:
        argv = sreport_argv(start, end, cluster=self.cluster, sreport=self._exe("sreport"))
        return parsing.parse_account_minutes(self._run(argv))

    def usage_rolled_up(self, start: dt.datetime, end: dt.datetime) -> bool:
        argv = sreport_utilization_argv(start, end, cluster=self.cluster, sreport=self._exe("sreport"))
        return parsing.parse_utilization_reported(self._run(argv)) > 0


def is_idempotent_success(stdout: str, stderr: str, ok_patterns: tuple[str, ...]) -> bool:
    """A nonzero exit that only says "already so".

    sacctmgr prints " Nothing new added." on stdout both when the thing exists (fine) and when the
    request was wrong (e.g. the account does not exist): then it also writes an error to stderr, so
    an idempotent success needs the words and an empty stderr. scancel/scontrol print their
    "already gone" words on stderr, where they are the whole message."""
    err = stderr.strip()
    if err:
        return parsing.matches_any(err, ok_patterns) and not parsing.is_unavailable_message(err)
    return parsing.matches_any(stdout, ok_patterns)


def submit_dir_of(request: t.JobRequest) -> str:
    """Where the job is submitted from (SLURM_SUBMIT_DIR). SlurmRejected when the submit host has no
    such directory (nothing to retry)."""
    directory = request.submit_dir
    if not os.path.isabs(directory) or not os.path.isdir(directory):
        raise t.SlurmRejected(f"The submit directory {directory} does not exist on the submit host.", command="sbatch")
    return directory
