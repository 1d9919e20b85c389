"""Pure parsers for Slurm's text output (no subprocess, no Django): unit-tested on real samples.

Everything here takes strings exactly as Slurm 22.05 prints them (``SLURM_TIME_FORMAT=standard``)
and returns plain Python values; the CLI backend composes them into the typed results.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import signal

from .types import SlurmError, SlurmRejected, SlurmUnavailable

# Field separator for squeue/sacct output: ASCII "unit separator". Job names and comments may
# contain "|" or ";", but the portal never lets control characters into them (see cli.py), so this
# character cannot appear inside a field.
FIELD_SEP = "\x1f"

_NONE_WORDS = {"", "n/a", "none", "unknown", "(null)", "not_set", "invalid"}


# --- times -------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8192)  # a sync cycle reads every queued job's times again: mostly the same strings
def parse_time(value: str) -> dt.datetime | None:
    """Slurm timestamp ("2024-05-01T12:34:56", no zone) -> aware UTC.

    The gateway runs every Slurm command with ``TZ=UTC`` (cli._clean_env), so Slurm prints UTC:
    the hour a DST change repeats is dated right, whatever the host's zone.
    "N/A", "Unknown", "None" and "" -> None."""
    value = value.strip()
    if value.lower() in _NONE_WORDS:
        return None
    try:
        # exactly Slurm's "%Y-%m-%dT%H:%M:%S"; fromisoformat reads it 10 times faster than strptime
        if len(value) != 19 or value[10] != "T":
            raise ValueError(value)
        naive = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return naive.replace(tzinfo=dt.UTC)


def format_time(value: dt.datetime) -> str:
    """Aware (or naive UTC) datetime -> the UTC string Slurm's commands accept (run with TZ=UTC)."""
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%S")


_DURATION_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_duration_minutes(value: str) -> int | None:
    """Slurm duration -> whole minutes. "UNLIMITED", "Partition_Limit", "N/A" -> None.

    Accepts "MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS" (Slurm's own rules)."""
    value = value.strip()
    if value.lower() in _NONE_WORDS or value.upper() in ("UNLIMITED", "INFINITE", "PARTITION_LIMIT"):
        return None
    match = _DURATION_RE.match(value)
    if not match:
        return None
    days, first, second, third = match.groups()
    days_n = int(days) if days else 0
    if days:
        # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
    elif third is not None:  # HH:MM:SS
        hours, minutes, seconds = int(first), int(second), int(third)
    elif second is not None:  # MM:SS
        hours, minutes, seconds = 0, int(first), int(second)
    else:  # MM
        hours, minutes, seconds = 0, int(first), 0
    total_seconds = ((days_n * 24 + hours) * 60 + minutes) * 60 + seconds
    return total_seconds // 60


def parse_int(value: str, default: int | None = None) -> int | None:
    value = value.strip()
    try:
        return int(value)
    except ValueError:
        return default


def parse_minutes_raw(value: str) -> int | None:
    """sacct TimelimitRaw: minutes as an integer, or "UNLIMITED" / "Partition_Limit"."""
    return parse_int(value, None)


# --- states and exit codes ---------------------------------------------------------------------


def base_state(value: str) -> str:
    """"CANCELLED by 0" -> "CANCELLED"; "RUNNING" -> "RUNNING"; "" -> "UNKNOWN"."""
    word = value.strip().split(" ", 1)[0].upper()
    return word or "UNKNOWN"


def parse_exit_status(value: str) -> tuple[int | None, int | None]:
    """sacct's ExitCode as (exit code, signal): "0:0" -> (0, 0); "1:0" -> (1, 0); "0:9" -> (0, 9), a
    batch shell killed by SIGKILL; "0:53" -> (0, 53), slurmd's ESLURMD_IO_ERROR (SLURMD_ERROR_SIGNALS);
    "" -> (None, None)."""
    code, _, number = value.strip().partition(":")
    return parse_int(code, None), parse_int(number, None) if number else None


# When slurmstepd, not the job, ended the batch step, slurmctld keeps slurmd's error code (slurm_errno.h) as
# the job's exit status and sacct shows its low 7 bits as the signal. Seen on 22.05 and 25.11 (2026-12-07):
# a job whose --output its Unix user could not write ended "0:53", ESLURMD_IO_ERROR (4021). (A script whose
# interpreter is missing ends "2:0", not ESLURMD_EXECVE_FAILED's 52: only what was seen is named here.)
SLURMD_ERROR_SIGNALS = {
    4021 & 0x7F: "Slurm could not open the job's output or error file (slurmd's ESLURMD_IO_ERROR): can the "
                 "job's Unix user write to the directory of its --output and --error?",
}  # fmt: skip


def exit_signal_text(number: int | None) -> str:
    """The signal half of sacct's ExitCode in words: 9 → "signal 9 (SIGKILL)"; 53 → "signal 53: Slurm
    could not open …" (SLURMD_ERROR_SIGNALS); one nobody names → "signal 40"; 0 or None → "" (none)."""
    if not number:
        return ""
    if number in SLURMD_ERROR_SIGNALS:
        return f"signal {number}: {SLURMD_ERROR_SIGNALS[number]}"
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


# --- TRES and GRES -----------------------------------------------------------------------------

_MEM_FACTORS_MIB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024, "P": 1024**3}
_NUMBER_RE = re.compile(r"^(\d+(?:\.\d+)?)([KMGTP]?)$", re.IGNORECASE)


def parse_memory_mib(value: str) -> int:
    """"1G" -> 1024, "500M" -> 500, "2048K" -> 2, "1.50G" -> 1536, "64000" -> 64000 (MiB)."""
    match = _NUMBER_RE.match(value.strip())
    if not match:
        raise ValueError(f"not a memory size: {value!r}")
    number, suffix = match.groups()
    return round(float(number) * _MEM_FACTORS_MIB[suffix.upper() or "M"])


_COUNT_FACTORS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


def parse_tres(value: str) -> dict[str, int]:
    """"billing=1,cpu=1,gres/gpu:a100=2,gres/gpu=2,mem=1G,node=1" -> dict of ints, mem in MiB.

    Values Slurm prints with a unit suffix for counts (e.g. "energy=1.2K") are scaled by 1024 as
    Slurm does; anything unparsable is skipped rather than failing the whole record."""
    out: dict[str, int] = {}
    value = value.strip()
    if value.lower() in _NONE_WORDS:
        return out
    for item in value.split(","):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            continue
        raw = raw.strip()
        if raw.isascii() and raw.isdigit():  # a plain count (mem without a unit: MiB already)
            out[key] = int(raw)
            continue
        try:
            if key == "mem":
                out[key] = parse_memory_mib(raw)
            else:
                match = _NUMBER_RE.match(raw)
                if match is None:
                    # e.g. "-1" in sacctmgr output (cleared limit)
                    out[key] = int(raw)
                    continue
                number, suffix = match.groups()
                out[key] = round(float(number) * _COUNT_FACTORS[suffix.upper()])
        except ValueError:
            continue
    return out


def format_tres(values: dict[str, int]) -> str:
    """{"gres/gpu": 4} -> "gres/gpu=4" (keys sorted so argv is deterministic)."""
    return ",".join(f"{key}={values[key]}" for key in sorted(values))


def split_outside(value: str, brackets: str) -> list[str]:
    """``value`` split on the commas outside ``brackets`` (an opening and a closing character):
    "gpu:a100:2(IDX:0,2),gpu:h100:1" with "()" -> two items; "a100-[01,03],h100-01" with "[]" -> two."""
    opening, closing = brackets
    parts, depth, current = [], 0, []
    for char in value:
        if char == opening:
            depth += 1
        elif char == closing:
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


_GRES_ITEM_RE = re.compile(r"^(?P<name>[^:(]+)(?::(?P<type>[^:(]+))?:(?P<count>\d+)(?:\((?P<extra>[^)]*)\))?$")


def parse_gres(value: str) -> list[tuple[str, str, int]]:
    """Node GRES string -> [(name, type, count)].

    "gpu:a100:4(S:0)" -> [("gpu", "a100", 4)]; "gpu:4" -> [("gpu", "", 4)];
    "gpu:a100:2(IDX:0-1),gpu:h100:0(IDX:N/A)" -> two items; "(null)" -> []."""
    value = value.strip()
    if value.lower() in _NONE_WORDS:
        return []
    # Split on commas that are not inside parentheses ("(S:0-1)" never holds commas, but
    # "(IDX:0,2)" does).
    out = []
    for item in split_outside(value, "()"):
        item = item.strip()
        if item.startswith("gres:"):
            item = item[len("gres:") :]
        match = _GRES_ITEM_RE.match(item)
        if match:
            out.append((match["name"], match["type"] or "", int(match["count"])))
    return out


# --- key=value records (scontrol show ... -o) --------------------------------------------------

_KV_SPLIT_RE = re.compile(r" (?=[A-Za-z][A-Za-z0-9_:./]*=)")


def parse_kv_line(line: str) -> dict[str, str]:
    """One line of ``scontrol show <entity> -o`` -> {Key: value}.

    Values may contain spaces (e.g. ``Reason=Not responding [slurm@2024-...]``): a new key starts
    only where a space is followed by ``Word=``."""
    out: dict[str, str] = {}
    for part in _KV_SPLIT_RE.split(line.strip()):
        key, sep, value = part.partition("=")
        if sep:
            out[key] = value.strip()
    return out


def null_to_empty(value: str | None) -> str:
    if value is None:
        return ""
    return "" if value.strip().lower() in ("(null)", "n/a", "none") else value.strip()


def tres_per_node(value: str) -> str:
    """squeue's %b in one form: "gres:gpu:a100:2" (Slurm 22.05) and "gres/gpu:a100:2" (25.11, measured)
    -> "gres:gpu:a100:2"; "N/A" -> ""."""
    value = null_to_empty(value)
    return ",".join(f"gres:{item[5:]}" if item.startswith("gres/") else item for item in value.split(",")) if value else ""


def split_list(value: str | None) -> tuple[str, ...]:
    value = null_to_empty(value)
    return tuple(item for item in value.split(",") if item) if value else ()


# --- hostlists ---------------------------------------------------------------------------------


def expand_hostlist(value: str) -> tuple[str, ...]:
    """"a100-[01-02],h100-01" -> ("a100-01", "a100-02", "h100-01") without calling Slurm."""
    value = null_to_empty(value)
    if not value:
        return ()
    out: list[str] = []
    for part in split_outside(value, "[]"):
        out.extend(_expand_one(part.strip()))
    return tuple(out)


def _expand_one(pattern: str) -> list[str]:
    match = re.match(r"^(?P<prefix>[^\[]*)\[(?P<ranges>[^\]]+)\](?P<rest>.*)$", pattern)
    if not match:
        return [pattern] if pattern else []
    names = []
    for rng in match["ranges"].split(","):
        low, _, high = rng.partition("-")
        if high:
            width = len(low)
            for number in range(int(low), int(high) + 1):
                names.append(f"{number:0{width}d}")
        else:
            names.append(low)
    out = []
    for name in names:
        out.extend(_expand_one(match["prefix"] + name + match["rest"]))
    return out


# --- error classification ----------------------------------------------------------------------

# Words in Slurm's stderr that mean "the controller or slurmdbd did not answer": retry later.
UNAVAILABLE_PATTERNS = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "problem talking to the database",
    "unable to connect to database",
    "slurmdbd: connection",
    "failed to open persistent connection",
    "zero bytes were transmitted or received",
    "communication connection failure",
    "unable to establish controller machine",
    "could not establish a configuration source",
    "transport endpoint is not connected",
    "temporarily unable to accept job",
    "database is busy",
    "connection timed out",
    "slurmctld is not responding",
    "no route to host",
    # a controller that died while answering (seen by make test-site at the primary slurmctld's SIGKILL):
    # the job may have been created — the relay looks it up by its tag before it sends it again
    "unexpected missing socket error",
    # the rest of Slurm's own words for a message lost on the way (slurm_errno.c: SLURM_COMMUNICATIONS_*,
    # SLURMCTLD_COMMUNICATIONS_*, the socket layer's 5003-5005), the controller's rate limit, a
    # controller in standby, and the system's for a connection cut (errno ECONNRESET, EPIPE, EAGAIN)
    "message send failure",
    "message receive failure",
    "communication shutdown failure",
    "insane message length",
    "header lengths are longer than data received",
    "rate limit exceeded",
    "in standby mode",
    "connection reset by peer",
    "broken pipe",
    "resource temporarily unavailable",
    "unable to create job record, try again",
)

# Nonzero exits that mean "already so": idempotent successes, per command family.
ALREADY_GONE_PATTERNS = (
    "invalid job id specified",
    "job/step already completing or completed",
    "already completing or completed",
)
NOTHING_TO_DO_PATTERNS = (
    "nothing new added",
    "nothing modified",
    "nothing deleted",
    "already exists",
    # Slurm 25.11's sacctmgr (measured, exit 1, nothing on stderr): " Already existing account X on
    # cluster C" and, for a user already in the account, "Request didn't affect anything" over
    # " Nothing added." (a missing account prints "No account X on cluster C, skipping." over the
    # same " Nothing added.", which is why "nothing added" alone is not a pattern).
    "already existing account",
    "request didn't affect anything",
)
RESERVATION_MISSING_PATTERNS = (
    "requested reservation is invalid",
    "invalid reservation",
    "reservation not found",
)


def stderr_message(stderr: str, stdout: str = "") -> str:
    """Slurm's own words: the non-empty stderr lines (stdout when stderr is empty)."""
    text = stderr.strip() or stdout.strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "\n".join(lines) or "Slurm command failed without a message"


def is_unavailable_message(message: str) -> bool:
    lowered = message.lower()
    return any(pattern in lowered for pattern in UNAVAILABLE_PATTERNS)


def matches_any(message: str, patterns: tuple[str, ...]) -> bool:
    lowered = message.lower()
    return any(pattern in lowered for pattern in patterns)


def classify_failure(*, returncode: int, stderr: str, stdout: str = "", command: str = "") -> SlurmError:
    """The one place that maps a failed Slurm command to the gateway's two errors.

    Controller/slurmdbd unreachable -> SlurmUnavailable (retry later); anything else nonzero ->
    SlurmRejected carrying Slurm's message (never retried)."""
    message = stderr_message(stderr, stdout)
    if is_unavailable_message(message):
        return SlurmUnavailable(message, command=command)
    if returncode < 0:
        # Killed by a signal (not by us: timeouts are handled before): treat as transient.
        return SlurmUnavailable(f"{command or 'Slurm command'} killed by signal {-returncode}: {message}",
                                command=command)
    return SlurmRejected(message, command=command)


def parse_account_minutes(output: str) -> dict[str, int]:
    """``sreport -n -P cluster AccountUtilizationByUser -T gres/gpu -t Minutes``: rows are
    Cluster|Account|Login|Proper Name|TRES Name|Used; account totals have an empty Login (the
    "root" account's total, the sum over everything, is dropped)."""
    minutes: dict[str, int] = {}
    for line in output.splitlines():
        parts = line.split("|")
        if len(parts) < 6:
            continue
        account, login, used = parts[1].strip(), parts[2].strip(), parts[-1].strip()
        if login or not account or account == "root":
            continue
        try:
            minutes[account] = int(used)
        except ValueError:
            continue
    return minutes


def parse_utilization_reported(output: str) -> int:
    """``sreport -n -P cluster Utilization -t Seconds format=Cluster,Reported``: the reported
    seconds summed over the rows (0 when slurmdbd has rolled up no hour of the range: no row)."""
    total = 0
    for line in output.splitlines():
        parts = line.split("|")
        if len(parts) >= 2 and parts[-1].strip().isascii() and parts[-1].strip().isdigit():
            total += int(parts[-1].strip())
    return total


# Slurm errno values that mean "controller / slurmdbd unreachable" (slurm_errno.h), besides the
# message words in parsing.UNAVAILABLE_PATTERNS which are checked as well
# (the pyslurm backend).
UNAVAILABLE_ERRNOS = frozenset(
    {
        104,  # ECONNRESET
        110,  # ETIMEDOUT
        111,  # ECONNREFUSED
        113,  # EHOSTUNREACH
        11,  # EAGAIN
        32,  # EPIPE
        1001, 1002, 1003, 1004,  # SLURM_COMMUNICATIONS_{CONNECTION,SEND,RECEIVE,SHUTDOWN}_ERROR
        1008,  # SLURM_PROTOCOL_INSANE_MSG_LENGTH (a message cut short)
        1013,  # SLURM_COMMUNICATIONS_MISSING_SOCKET_ERROR
        1800, 1801, 1802, 1803, 1804, 1805,  # SLURMCTLD_COMMUNICATIONS_*_ERROR, _BACKOFF, _HARD_DROP
        2007,  # ESLURM_ERROR_ON_DESC_TO_RECORD_COPY ("Unable to create job record, try again")
        2027,  # ESLURM_IN_STANDBY_MODE
        5003,  # ESLURM_PROTOCOL_INCOMPLETE_PACKET
        5004,  # SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT
        5005,  # SLURM_PROTOCOL_SOCKET_ZERO_BYTES_SENT
        7000,  # ESLURM_DB_CONNECTION
    }
)  # fmt: skip
GONE_ERRNOS = frozenset({2017, 2021})  # ESLURM_INVALID_JOB_ID, ESLURM_ALREADY_DONE
