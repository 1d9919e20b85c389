"""The ``#SBATCH`` directives of a batch script, read exactly as sbatch reads them.

One parser for the server and the CLI (pure: standard library only, Python >= 3.9).

How sbatch reads a script (Slurm's ``src/sbatch/opt.c``, ``_opt_batch_script`` and
``get_argument``), and so how this module does:

- lines beginning with ``#SBATCH`` (or the old ``#SLURM``) in the first column are directives;
  blank lines and other comments (``#!``, ``# ...``, an indented ``#SBATCH``) are skipped; the first
  line that is neither ends the block;
- a directive line is split into words: whitespace separates, ``'`` and ``"`` quote, a backslash
  escapes, an unquoted ``#`` ends the line;
- the words of all lines form one argv, read by ``getopt_long`` with the option table of the
  target cluster's Slurm release (``gpuportal_sbatch.options``, generated from Slurm's sources; no
  release: every release's options, for the CLI, which does not know the cluster):
  ``--opt=value`` or ``--opt value`` (also across lines), ``-t15``/``-t 15``, clusters of one-letter
  options (``-vH``), unambiguous abbreviations of long names (``--nod=2``), optional values only
  after ``=`` (``--exclusive=user``);
- an unknown or ambiguous option, a missing value, or a word that is not an option is an error
  (sbatch: "Invalid directive found in batch script"); an option another release has is an error
  naming both ("sbatch of Slurm 22.05 has no option --extra (25.11 has it)").

Then ``script_request`` turns the directives into numbers the portal estimates and checks with
(GPUs, nodes, tasks, time, memory, array size), each error naming the directive's line.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .options import NONE, OPTIONAL, OPTIONS, RELEASES, REQUIRED

__all__ = [
    "Directive",
    "DirectiveError",
    "OptionTable",
    "ScriptRequest",
    "apply_overrides",
    "begin_latest",
    "check_mail_type",
    "disable_directives",
    "parse_array",
    "parse_directives",
    "parse_gpu_count",
    "parse_memory_mb",
    "MIB_PER_GIB",
    "memory_gb",
    "memory_gb_exact",
    "parse_time_minutes",
    "parse_time_limit_minutes",
    "option_table",
    "release_of",
    "release_problems",
    "resolve_option",
    "script_request",
    "EXCLUSIVE_GROUPS",
    "CLUSTER_OPTIONS",
]

MAGIC_WORDS = ("#SBATCH", "#SLURM")

# C's isspace() in the "C" locale, which sbatch's parser uses: str.isspace() would also take
# U+00A0, U+2003, \x1c-\x1f, …, and read a block or split a word where sbatch does not.
C_SPACE = " \t\n\v\f\r"


def is_c_digits(text: str) -> bool:
    """Only 0-9, as strtol reads them (str.isdigit() also takes "²" and "٣")."""
    return bool(text) and text.isascii() and text.isdigit()


class DirectiveError(ValueError):
    """A directive sbatch would refuse (or the portal refuses on purpose). ``line`` is 1-based
    (0: not from the script, e.g. an API field), ``option`` the long option name ("" if unknown)."""

    def __init__(self, message: str, *, line: int = 0, option: str = ""):
        super().__init__(message)
        self.message = message
        self.line = line
        self.option = option

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}" if self.line else self.message


@dataclass(frozen=True)
class Directive:
    """One option as sbatch understood it: the long name, its value (None: given without one),
    the script line it came from (0: not from the script), the words as written, and the option as
    written (``--nod``, ``-N``; "" when not from the script)."""

    option: str
    value: Optional[str]
    line: int
    text: str
    spelled: str = field(default="", compare=False)

    def as_arg(self) -> str:
        """The option as one argv word (``--time=15``, ``--exclusive``)."""
        return f"--{self.option}" if self.value is None else f"--{self.option}={self.value}"


# ---------------------------------------------------------------- reading the block


def _words(body: str, line: int) -> List[str]:
    """sbatch's get_argument over one directive line (after the magic word)."""
    words: List[str] = []
    i, n = 0, len(body)
    while i < n:
        while i < n and body[i] in C_SPACE:
            i += 1
        if i >= n:
            break
        if body[i] == ":":
            raise DirectiveError(f"unexpected ':' in {body.strip()!r}", line=line)
        word: List[str] = []
        started = False
        quote = ""
        while i < n and (quote or body[i] not in C_SPACE):
            char = body[i]
            if char == "\\":  # an escape, inside quotes too (get_argument)
                i += 1
                if i < n:
                    word.append(body[i])
                    started = True
                    i += 1
                continue
            if quote:
                if char == quote:
                    quote = ""
                else:
                    word.append(char)
                i += 1
                continue
            if char in "\"'":
                quote = char
                started = True
                i += 1
                continue
            if char == "#":
                i = n  # an unquoted '#': the rest of the line is a comment
                break
            word.append(char)
            started = True
            i += 1
        if quote:
            raise DirectiveError(f"unmatched {quote} in {body.strip()!r}", line=line)
        if started:
            words.append("".join(word))
    return words


def directive_lines(script: str) -> List[Tuple[int, str]]:
    """(line number, text after the magic word) of every directive line sbatch reads."""
    found: List[Tuple[int, str]] = []
    for number, raw in enumerate(script.split("\n"), start=1):
        line = raw[:-1] if raw.endswith("\r") else raw
        magic = next((m for m in MAGIC_WORDS if line.startswith(m)), None)
        if magic is None:
            stripped = line.lstrip(C_SPACE)
            if stripped and not stripped.startswith("#"):
                break  # the first command ends the block
            continue
        body = line[len(magic):]
        head = re.split("[" + C_SPACE + "]", body.strip(C_SPACE), maxsplit=1)[0].lower()
        if head in ("hetjob", "packjob"):
            raise DirectiveError(
                f"'{magic} {head}': heterogeneous jobs are not supported by the portal; submit the components as separate jobs",
                line=number,
            )
        found.append((number, body))
    return found


# ---------------------------------------------------------------- the option table of a release


@dataclass(frozen=True)
class OptionTable:
    """sbatch's options in one release (``release`` None: in any release the table has): long name
    -> has_arg, one letter -> long name, and each long name's releases."""

    release: Optional[str]
    has_arg: Dict[str, str]
    short: Dict[str, str]
    releases: Dict[str, Tuple[str, ...]]


def _table(release: Optional[str]) -> OptionTable:
    has_arg: Dict[str, str] = {}
    short: Dict[str, str] = {}
    releases: Dict[str, Tuple[str, ...]] = {}
    for name, arg, letter, found in OPTIONS:
        releases[name] = tuple(sorted(set(releases.get(name, ())) | set(found)))
        if release is not None and release not in found:
            continue
        # any release: an option optional in one and without a value in another takes one after '='
        # (a value required in one release and not in another would read the next word differently:
        # the generated table has none, tests/sbatch checks it)
        has_arg[name] = OPTIONAL if has_arg.get(name, arg) != arg else arg
        if letter:
            short[letter] = name
    return OptionTable(release, has_arg, short, releases)


_TABLES: Dict[Optional[str], OptionTable] = {release: _table(release) for release in (None, *RELEASES)}


def option_table(release: Optional[str] = None) -> OptionTable:
    """The options of sbatch in ``release`` ("22.05"; one of options.RELEASES), None: in any of them.
    A release the table does not have is a ValueError (``release_of`` maps a version to a release)."""
    try:
        return _TABLES[release]
    except KeyError:
        raise ValueError(f"no sbatch option table for Slurm {release!r} (known: {', '.join(RELEASES)})") from None


def release_of(version: Optional[str]) -> Optional[str]:
    """The table's release for a Slurm version ("22.05.8" -> "22.05"), None when the table has no
    such release (or no version is known): a job for that cluster is read with every release's options."""
    match = re.match(r"([0-9]+)\.([0-9]+)", (version or "").strip())
    release = f"{int(match.group(1)):02d}.{int(match.group(2)):02d}" if match else None
    return release if release in RELEASES else None


def _lacking(spelled: str, option: str, table: OptionTable, line: int) -> DirectiveError:
    """The error for an option (``spelled`` as written: ``--extra``, ``--ext``, ``-G``) that
    ``table``'s release lacks and other releases have."""
    others = ", ".join(table.releases[option])
    known = "it" if spelled == f"--{option}" else f"--{option}"
    return DirectiveError(
        f"sbatch of Slurm {table.release} has no option {spelled} ({others} {'have' if ',' in others else 'has'} {known})",
        line=line, option=option,
    )  # fmt: skip


def resolve_option(name: str, *, line: int = 0, release: Optional[str] = None) -> str:
    """A long option name as getopt_long resolves it in ``release``'s sbatch (None: any release's):
    the exact name, or the one option the abbreviation is a prefix of. Unknown and ambiguous names
    are a DirectiveError; one that only other releases know names them."""
    table = option_table(release)
    if name in table.has_arg:
        return name
    matches = [option for option in table.has_arg if option.startswith(name)] if name else []
    if len(matches) == 1:
        return matches[0]
    if not matches:
        if release is not None:
            try:
                other = resolve_option(name, line=line)
            except DirectiveError:
                pass
            else:
                raise _lacking(f"--{name}", other, table, line)
        raise DirectiveError(f"unrecognized option '--{name}'", line=line)
    raise DirectiveError(
        f"option '--{name}' is ambiguous; possibilities: " + " ".join(f"'--{m}'" for m in sorted(matches)),
        line=line,
        option=name,
    )


def _no_argument(option: str, line: int, table: OptionTable) -> DirectiveError:
    """``--option=value`` for an option that takes none (in ``table``'s release, when another release's takes one)."""
    where = f" (sbatch of Slurm {table.release})" if option_table(None).has_arg[option] != NONE else ""
    return DirectiveError(f"option '--{option}' doesn't allow an argument{where}", line=line, option=option)


def _short_option(letter: str, line: int, table: OptionTable) -> str:
    option = table.short.get(letter)
    if option is None:
        other = option_table(None).short.get(letter)
        if other is not None and table.release is not None:
            raise _lacking(f"-{letter}", other, table, line)  # (no letter differs between 22.05 and 25.11)
        raise DirectiveError(f"invalid option -- '{letter}'", line=line)
    return option


def release_problems(directives: List[Directive], release: Optional[str]) -> List[Tuple[Directive, DirectiveError]]:
    """What ``release``'s sbatch refuses among directives read for any release (``parse_directives``
    without one, before the cluster was known): each directive whose option as written that release
    lacks (naming the releases that have it), or that takes no value there: what parsing for the
    release refuses first. Not the same in two cases, where the name as written means one option
    among every release's options and another (or none) among ``release``'s: ``--extra`` is 25.11's
    --extra and an abbreviation of 22.05's --extra-node-info (refused here, naming both: the script
    meant the one the portal read); ``--ext`` is ambiguous among every release's options, 22.05's
    --extra-node-info alone (refused already by parsing for any release: write the full name)."""
    if release is None:
        return []
    table = option_table(release)
    problems = []
    for directive in directives:
        if not directive.spelled:
            continue
        try:
            if directive.spelled.startswith("--"):
                option = resolve_option(directive.spelled[2:], line=directive.line, release=release)
            else:
                option = _short_option(directive.spelled[1:], directive.line, table)
            if option != directive.option:  # 22.05 reads --extra as --extra-node-info (25.11 has --extra)
                raise DirectiveError(
                    f"sbatch of Slurm {release} reads {directive.spelled} as --{option}, not as --{directive.option} "
                    f"({', '.join(table.releases[directive.option])} has it): write --{option} if that is meant",
                    line=directive.line, option=directive.option,
                )  # fmt: skip
            if directive.value is not None and table.has_arg[option] == NONE:
                raise _no_argument(option, directive.line, table)
        except DirectiveError as exc:
            problems.append((directive, exc))
    return problems


# ---------------------------------------------------------------- reading the options


def parse_args(words: List[Tuple[str, int]], release: Optional[str] = None) -> List[Directive]:
    """getopt_long over (word, line) pairs with the table of ``release``'s sbatch (None: any
    release's). A word that is not an option is an error, as sbatch reports it ("Invalid directive
    found in batch script")."""
    table = option_table(release)
    out: List[Directive] = []
    i = 0
    while i < len(words):
        word, line = words[i]
        i += 1
        if word == "--":
            if i < len(words):
                raise DirectiveError(f"invalid directive found in batch script: {words[i][0]}", line=words[i][1])
            break
        if word.startswith("--"):
            name, eq, value = word[2:].partition("=")
            option = resolve_option(name, line=line, release=release)
            has_arg = table.has_arg[option]
            spelled = f"--{name}"
            if eq:
                if has_arg == NONE:
                    raise _no_argument(option, line, table)
                out.append(Directive(option, value, line, word, spelled))
            elif has_arg == REQUIRED:
                if i >= len(words):
                    raise DirectiveError(f"option '--{option}' requires an argument", line=line, option=option)
                value, _ = words[i]
                i += 1
                out.append(Directive(option, value, line, f"{word} {value}", spelled))
            else:
                out.append(Directive(option, None, line, word, spelled))
        elif word.startswith("-") and len(word) > 1:
            j = 1
            while j < len(word):
                letter = word[j]
                j += 1
                option = _short_option(letter, line, table)
                has_arg = table.has_arg[option]
                spelled = f"-{letter}"
                if has_arg == NONE:
                    out.append(Directive(option, None, line, spelled, spelled))
                    continue
                rest = word[j:]
                if rest:
                    out.append(Directive(option, rest, line, word, spelled))
                elif has_arg == OPTIONAL:
                    out.append(Directive(option, None, line, word, spelled))
                else:
                    if i >= len(words):
                        raise DirectiveError(f"option requires an argument -- '{letter}'", line=line, option=option)
                    value, _ = words[i]
                    i += 1
                    out.append(Directive(option, value, line, f"{word} {value}", spelled))
                break
        else:
            raise DirectiveError(f"invalid directive found in batch script: {word}", line=line)
    return out


def parse_directives(script: str, release: Optional[str] = None) -> List[Directive]:
    """The directives of a batch script, in order (later ones override earlier ones of the same
    option, as in sbatch), read as ``release``'s sbatch reads them ("22.05", "25.11"; None: as any
    release's would). Raises DirectiveError naming the line for what that sbatch would refuse."""
    words: List[Tuple[str, int]] = []
    for number, body in directive_lines(script):
        words.extend((word, number) for word in _words(body, number))
    return parse_args(words, release)


# ---------------------------------------------------------------- values as Slurm reads them


def parse_time_minutes(value: str, *, line: int = 0, option: str = "time") -> Optional[int]:
    """Slurm's time_str2mins: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``; seconds
    round up. None: no limit (``UNLIMITED``, ``INFINITE``, ``-1``, or ``0``)."""
    text = (value or "").strip()
    if text.lower() in ("unlimited", "infinite", "-1"):
        return None
    days = 0
    rest = text
    match = re.fullmatch(r"([0-9]+)-([0-9]+(?::[0-9]+){0,2})", text)
    if match:
        days, rest = int(match.group(1)), match.group(2)
        parts = [int(p) for p in rest.split(":")]
        hours, minutes, seconds = (parts + [0, 0])[:3]
    elif re.fullmatch(r"[0-9]+(?::[0-9]+){0,2}", text):
        parts = [int(p) for p in text.split(":")]
        if len(parts) == 1:
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, minutes, seconds = 0, parts[0], parts[1]
        else:
            hours, minutes, seconds = parts
    else:
        raise DirectiveError(f"invalid time limit specification --{option}={value}", line=line, option=option)
    total = math.ceil((days * 86400 + hours * 3600 + minutes * 60 + seconds) / 60)
    return None if total == 0 else total


_HUMAN_TIME_RE = re.compile(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m(?:in)?)?(?:([0-9]+)s)?")


def parse_time_limit_minutes(value: str) -> int:
    """A time limit as a person types it for the portal (the form, the CLI's ``--time``): any of
    sbatch's forms (``parse_time_minutes``) or the shorter ``2h``, ``90m``, ``1h30m``, ``2d``, ``45s``;
    whole minutes, seconds rounding up as in Slurm. No limit (``UNLIMITED``, ``0``) is refused: the
    portal needs a number to estimate the cost. Raises DirectiveError (a ValueError)."""
    text = (value or "").strip().lower()
    if not text:
        raise DirectiveError("empty time limit", option="time")
    human = _HUMAN_TIME_RE.fullmatch(text)
    if human and any(human.groups()):
        d, h, m, s = (int(g) if g else 0 for g in human.groups())
        minutes = math.ceil((d * 86400 + h * 3600 + m * 60 + s) / 60) or None
    else:
        try:
            minutes = parse_time_minutes(text)
        except DirectiveError:
            raise DirectiveError(
                f"time limit {value!r}: use minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or 2h / 90m / 1h30m", option="time"
            ) from None
    if minutes is None:
        raise DirectiveError(f"time limit {value!r}: give a finite limit (the portal estimates the cost from it)",
                             option="time")  # fmt: skip
    return minutes


_MEM_RE = re.compile(r"([0-9]+)([KMGTkmgt]?)[Bb]?")
# Memory: Slurm counts MiB; the portal's ``memory_gb`` is whole GiB. The one converter between them.
MIB_PER_GIB = 1024
_MEM_FACTOR = {"": 1, "k": 1 / MIB_PER_GIB, "m": 1, "g": MIB_PER_GIB, "t": MIB_PER_GIB * MIB_PER_GIB}


def memory_gb(mb: int, *, up: bool = True) -> int:
    """MiB as whole GiB: rounded up (what a job of ``mb`` uses, as the estimate and the checks count
    it), or down (``up=False``: the most that fits under a limit of ``mb``)."""
    return -(-mb // MIB_PER_GIB) if up else mb // MIB_PER_GIB


def memory_gb_exact(mb: int) -> Optional[int]:
    """MiB as whole GiB when it is a whole number of them (what a form field can show back), else None."""
    return mb // MIB_PER_GIB if mb % MIB_PER_GIB == 0 else None


def parse_memory_mb(value: str, *, line: int = 0, option: str = "mem") -> int:
    """Slurm's str_to_mbytes: a whole number, MiB unless a K/M/G/T suffix says otherwise (0 allowed:
    ``--mem=0`` is all of a node's memory)."""
    match = _MEM_RE.fullmatch((value or "").strip())
    if not match:
        raise DirectiveError(f"invalid --{option} specification: {value}", line=line, option=option)
    return math.ceil(int(match.group(1)) * _MEM_FACTOR[match.group(2).lower()])


def parse_gpu_count(value: str, *, line: int = 0, option: str = "gpus") -> Tuple[str, int]:
    """``[type:]N`` (``--gpus``, ``--gpus-per-node``, ``--gpus-per-task``) → (type, N)."""
    text = (value or "").strip()
    match = re.fullmatch(r"(?:(?:gpu:)?([A-Za-z0-9_.-]+?):)?([0-9]+)", text)
    if not match or ("," in text):
        raise DirectiveError(f"invalid --{option} specification: {value} (expected [type:]count)", line=line, option=option)
    return match.group(1) or "", int(match.group(2))


def parse_gres_gpu(value: str, *, line: int = 0, option: str = "gres") -> Optional[Tuple[str, int]]:
    """The GPU part of a ``--gres`` list (``gpu``, ``gpu:2``, ``gpu:a100:2``, ``gpu:a100:2,shard:1``):
    (type, count per node), or None without GPUs. ``--gres=none`` is none."""
    for item in value.split(","):
        item = item.strip()
        if item.startswith("gres/"):
            item = item[len("gres/"):]
        name, _, rest = item.partition(":")
        if name != "gpu":
            continue
        if not rest:
            return "", 1
        parts = rest.split(":")
        if len(parts) == 1:
            return (("", int(parts[0])) if is_c_digits(parts[0]) else (parts[0], 1))
        if len(parts) == 2 and is_c_digits(parts[1]):
            return parts[0], int(parts[1])
        raise DirectiveError(f"invalid --{option} specification: {value}", line=line, option=option)
    return None


_BEGIN_UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 7 * 86400}
_BEGIN_NOW_RE = re.compile(r"now(?:[ \t]*([+-])[ \t]*([0-9]+)[ \t]*(seconds?|minutes?|hours?|days?|weeks?)?)?", re.I)
_BEGIN_ISO_RE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})(?:T([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?)?")
# the forms that mean "within the next day": a clock time (today or tomorrow), Slurm's named hours
_BEGIN_SOON_RE = re.compile(
    r"(?:(?:today|tomorrow)(?:[ T]?[0-9]{1,2}:[0-9]{2}(?::[0-9]{2})?)?|midnight|noon|elevenses|fika|teatime"
    r"|[0-9]{1,2}:[0-9]{2}(?::[0-9]{2})?(?:[ \t]*[ap]m)?)",
    re.I,
)


def begin_latest(value: str, *, now: dt.datetime, line: int = 0) -> dt.datetime:
    """The latest moment ``--begin=value`` can mean (Slurm's parse_time), for the forms the portal
    can tell: ``now[+N[seconds|minutes|hours|days|weeks]]``, ``YYYY-MM-DD[THH:MM[:SS]]`` (in UTC, as
    the portal runs sbatch), ``uts<seconds>``, and a clock time or named hour (``16:00``, ``tomorrow``,
    ``teatime``: within two days). Any other form (``MMDD[YY]``, ``MM/DD``, combinations) is a
    DirectiveError: the portal would not know how long the job may wait. ``now``: aware, UTC."""
    text = (value or "").strip(C_SPACE)
    match = _BEGIN_NOW_RE.fullmatch(text)
    if match:
        sign, count, unit = match.groups()
        seconds = int(count or 0) * _BEGIN_UNITS[(unit or "second").lower().rstrip("s")]
        return now + dt.timedelta(seconds=seconds if sign != "-" else 0)
    match = _BEGIN_ISO_RE.fullmatch(text)
    if match:
        parts = [int(p) if p else 0 for p in match.groups()]
        try:
            return dt.datetime(*parts, tzinfo=dt.timezone.utc)
        except ValueError:
            raise DirectiveError(f"invalid --begin time {value!r}", line=line, option="begin") from None
    if text[:3].lower() == "uts" and is_c_digits(text[3:]) and int(text[3:]) >= 1_000_000:
        try:
            return dt.datetime.fromtimestamp(int(text[3:]), tz=dt.timezone.utc)
        except (OverflowError, OSError, ValueError):
            raise DirectiveError(f"invalid --begin time {value!r}", line=line, option="begin") from None
    if _BEGIN_SOON_RE.fullmatch(text):
        return now + dt.timedelta(days=2)
    raise DirectiveError(
        f"--begin={value}: the portal reads --begin as now+N[minutes|hours|days], YYYY-MM-DD[THH:MM[:SS]] "
        "(UTC) or a clock time (HH:MM); write it in one of those forms",
        line=line, option="begin",
    )


# --mail-type values Slurm accepts (src/common/proc_args.c, parse_mail_type), comma-separated, any case
MAIL_TYPES = frozenset({
    "NONE", "ARRAY_TASKS", "BEGIN", "END", "FAIL", "INVALID_DEPEND", "REQUEUE", "ALL", "STAGE_OUT",
    "TIME_LIMIT", "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50",
})  # fmt: skip


def check_mail_type(value: str, *, line: int = 0) -> List[str]:
    """``--mail-type``'s types, upper case, as sbatch reads them; a DirectiveError for one it refuses."""
    types = [item.strip(C_SPACE).upper() for item in (value or "").split(",") if item.strip(C_SPACE)]
    wrong = [item for item in types if item not in MAIL_TYPES]
    if not types or wrong:
        raise DirectiveError(
            f"--mail-type={value}: invalid mail type (Slurm takes {', '.join(sorted(MAIL_TYPES))})",
            line=line, option="mail-type",
        )
    return types


MAX_ARRAY_INDEX = 4_000_000


def parse_array(value: str, *, line: int = 0) -> Tuple[List[int], Optional[int]]:
    """``--array``: ``0-15``, ``1,3,5-7``, ``0-15:4`` (step), ``0-15%4`` (at most 4 at once) →
    (sorted task indexes, throttle or None)."""
    text = (value or "").strip()
    spec, _, throttle_text = text.partition("%")
    throttle = None
    if throttle_text:
        if not is_c_digits(throttle_text):
            raise DirectiveError(f"invalid --array specification: {value}", line=line, option="array")
        throttle = int(throttle_text)
    indexes = set()
    for part in spec.split(","):
        match = re.fullmatch(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?", part.strip())
        if not match:
            raise DirectiveError(f"invalid --array specification: {value}", line=line, option="array")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) else first
        step = int(match.group(3)) if match.group(3) else 1
        if last < first or step < 1 or last > MAX_ARRAY_INDEX:
            raise DirectiveError(f"invalid --array specification: {value}", line=line, option="array")
        indexes.update(range(first, last + 1, step))
    return sorted(indexes), throttle


def _positive(directive: Directive) -> int:
    text = (directive.value or "").strip()
    if not is_c_digits(text) or int(text) < 1:
        raise DirectiveError(
            f"invalid --{directive.option} value {directive.value!r}: expected a positive whole number",
            line=directive.line, option=directive.option,
        )
    return int(text)


def _node_range(directive: Directive) -> Tuple[int, int]:
    match = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", (directive.value or "").strip())
    if not match or int(match.group(1)) < 1 or (match.group(2) and int(match.group(2)) < int(match.group(1))):
        raise DirectiveError(f"invalid node count specification --nodes={directive.value}", line=directive.line, option="nodes")
    low = int(match.group(1))
    return low, int(match.group(2)) if match.group(2) else low


# ---------------------------------------------------------------- what a script asks for


# The options that choose the cluster (sbatch's -M/--clusters and its alias --cluster): the portal
# reads them as the cluster choice (jobs.spec); its gateway, which talks to one cluster through that
# cluster's own SLURM_CONF, never sends them to sbatch (portal.slurm.request).
CLUSTER_OPTIONS = frozenset({"clusters", "cluster"})


# Options Slurm refuses together (slurm_opt.c: validate_memory_options, the cpus-per-task vs
# cpus-per-gpu check, ntasks-per-gpu's list, core-spec/thread-spec, exclusive/oversubscribe): when
# the portal sets one of a group on the command line, the script's directives of the whole group go.
EXCLUSIVE_GROUPS: Tuple[frozenset, ...] = (
    frozenset({"mem", "mem-per-cpu", "mem-per-gpu"}),
    frozenset({"cpus-per-task", "cpus-per-gpu"}),
    frozenset({"ntasks-per-gpu", "gpus-per-task", "gpus-per-socket", "ntasks-per-node", "tres-per-task"}),
    frozenset({"core-spec", "thread-spec"}),
    frozenset({"exclusive", "oversubscribe"}),
    frozenset({"requeue", "no-requeue"}),
    # one GPU request: an explicit GPU form from the portal replaces the script's
    frozenset({"gres", "gpus", "gpus-per-node", "gpus-per-task"}),
)


def _group_of(option: str) -> frozenset:
    for group in EXCLUSIVE_GROUPS:
        if option in group:
            return group
    return frozenset({option})


def apply_overrides(directives: List[Directive], overrides: List[Directive]) -> List[Directive]:
    """The effective options: the script's directives, minus those the overrides replace (the same
    option, or one Slurm holds mutually exclusive with it), then the overrides (line 0), as
    sbatch's command line overrides a script. Later overrides of one option win."""
    replaced: set = set()
    for override in overrides:
        replaced |= _group_of(override.option)
    kept = [d for d in directives if d.option not in replaced]
    return kept + list(overrides)


def disable_directives(script: str, lines: set) -> str:
    """The script with the directives on ``lines`` (1-based) turned into plain comments, so that
    sbatch no longer reads them (the portal's command line replaces them)."""
    if not lines:
        return script
    out = []
    for number, raw in enumerate(script.split("\n"), start=1):
        if number in lines:
            magic = next((m for m in MAGIC_WORDS if raw.startswith(m)), None)
            if magic is not None:
                raw = "# [gpuportal: replaced] " + raw[1:]
        out.append(raw)
    return "\n".join(out)


@dataclass
class ScriptRequest:
    """The effective options (last one of each option), in the numbers the portal needs.

    GPU counts are for one job (one array task); ``gpus`` is None when the job asks for no GPU, and
    ``gpu_form`` says which option gave it (the count is then per node, per task or per job)."""

    options: Dict[str, Directive] = field(default_factory=dict)
    name: Optional[str] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    nodes_min: int = 1
    nodes_max: int = 1
    nodes_given: bool = False
    ntasks: Optional[int] = None
    ntasks_per_node: Optional[int] = None
    cpus_per_task: Optional[int] = None
    cpus_per_gpu: Optional[int] = None
    gpu_type: str = ""
    gpu_form: str = ""  # "gres"/"gpus-per-node" (per node), "gpus" (per job), "gpus-per-task"
    gpu_count: int = 0  # as given in that form
    mem_mb: Optional[int] = None  # per node; 0 = the whole node's memory
    mem_per_cpu_mb: Optional[int] = None
    mem_per_gpu_mb: Optional[int] = None
    exclusive: bool = False
    time_limit_minutes: Optional[int] = None  # None: not given (partition default) or unlimited
    time_unlimited: bool = False
    array: str = ""
    array_indexes: List[int] = field(default_factory=list)
    array_throttle: Optional[int] = None
    output: str = ""
    error: str = ""
    chdir: str = ""

    def line_of(self, option: str) -> int:
        directive = self.options.get(option)
        return directive.line if directive else 0

    @property
    def array_tasks(self) -> int:
        return len(self.array_indexes) or 1

    def tasks(self, nodes: int) -> int:
        """Tasks of the job on ``nodes`` nodes (sbatch: --ntasks, else --ntasks-per-node × nodes, else one per node)."""
        if self.ntasks is not None:
            return self.ntasks
        if self.ntasks_per_node is not None:
            return self.ntasks_per_node * nodes
        return nodes

    def nodes_for(self, cpus_per_node: int = 0) -> int:
        """The nodes Slurm gives the job (the most it may give when a range is asked for): the
        count given, else enough for --ntasks at --ntasks-per-node, else one."""
        if self.nodes_given:
            return self.nodes_max
        if self.ntasks is not None and self.ntasks_per_node:
            return max(1, math.ceil(self.ntasks / self.ntasks_per_node))
        if self.ntasks is not None and cpus_per_node:
            return max(1, math.ceil(self.ntasks * (self.cpus_per_task or 1) / cpus_per_node))
        return 1

    def gpus_total(self, *, nodes: int, gpus_per_node: int = 0) -> int:
        """GPUs Slurm allocates to one job (one array task) on ``nodes`` nodes; ``--exclusive``:
        every GPU of those nodes (``gpus_per_node`` of the partition's nodes)."""
        if self.exclusive and gpus_per_node:
            return gpus_per_node * nodes
        if self.gpu_form in ("gres", "gpus-per-node"):
            return self.gpu_count * nodes
        if self.gpu_form == "gpus-per-task":
            return self.gpu_count * self.tasks(nodes)
        return self.gpu_count


def _refused_before_submission(get, request: "ScriptRequest") -> None:
    """What sbatch refuses before it sends anything (src/sbatch/opt.c ``_opt_verify`` and
    src/common/slurm_opt.c ``validate_options_salloc_sbatch_srun``, 22.05 and 25.11), in its words.
    A job that reaches Slurm only to end SUBMIT_FAILED is refused here instead, naming the line."""
    per_task = get("gpus-per-task") or (get("tres-per-task") if request.gpu_form == "gpus-per-task" else None)
    if per_task and not (get("gpus") or get("ntasks") or get("nodes") or get("ntasks-per-node") or get("tasks-per-node")):
        # sbatch: "Failed to validate job spec" (-N gives one task per node; 22.05 also counts
        # --ntasks-per-node, which 25.11 refuses too: give -n/--ntasks)
        raise DirectiveError(
            f"--{per_task.option} used without either --gpus or -n/--ntasks is not allowed", line=per_task.line,
            option=per_task.option,
        )  # fmt: skip
    # (--ntasks-per-core above --threads-per-core: 25.11's sbatch refuses it, 22.05's submits it — measured
    # 2026-12-03; not refused here: the per-release table is of options, these value rules serve every release)
    if get("nodes") and get("distribution") and (get("distribution").value or "").lower().startswith("arbitrary"):
        raise DirectiveError("--nodes is incompatible with --distribution=arbitrary", line=get("distribution").line,
                             option="distribution")  # fmt: skip
    if get("tres-per-task"):
        for item in (get("tres-per-task").value or "").lower().split(","):
            name = item.split("=", 1)[0].split(":", 1)[0].strip()
            if name in ("mem", "energy", "node"):
                raise DirectiveError(f"Invalid TRES for --tres-per-task: {name}", line=get("tres-per-task").line,
                                     option="tres-per-task")  # fmt: skip


def script_request(directives: List[Directive]) -> ScriptRequest:
    """Read the effective directives (the last of each option wins) into a ScriptRequest.
    Values the portal needs are checked as sbatch checks them (DirectiveError naming the line)."""
    options: Dict[str, Directive] = {}
    for directive in directives:
        options[directive.option] = directive
    request = ScriptRequest(options=options)
    get = options.get
    if get("job-name"):
        request.name = get("job-name").value
    if get("partition"):
        request.partition = get("partition").value
    if get("account"):
        request.account = get("account").value
    if get("qos"):
        request.qos = get("qos").value
    if get("constraint"):
        request.constraint = get("constraint").value
    if get("nodes"):
        request.nodes_min, request.nodes_max = _node_range(get("nodes"))
        request.nodes_given = True
    if get("ntasks"):
        request.ntasks = _positive(get("ntasks"))
    for option, attr in (("ntasks-per-node", "ntasks_per_node"), ("tasks-per-node", "ntasks_per_node"),
                         ("cpus-per-task", "cpus_per_task"), ("cpus-per-gpu", "cpus_per_gpu")):  # fmt: skip
        if get(option):
            setattr(request, attr, _positive(get(option)))
    # GPUs: the last GPU form given (sbatch keeps them all, but one job asks in one form; a
    # script mixing per-node and per-job forms is refused rather than guessed)
    forms = [d for d in directives if d.option in ("gres", "gpus", "gpus-per-node", "gpus-per-task", "tres-per-task")]
    gpu_forms = {}
    for directive in forms:
        if directive.option == "gres":
            found = parse_gres_gpu(directive.value or "", line=directive.line)
            if found is None:
                gpu_forms.pop("gres", None)
                continue
            gpu_forms["gres"] = (found, directive)
        elif directive.option == "tres-per-task":
            found = parse_gres_gpu((directive.value or "").replace("gres/gpu", "gpu").replace("=", ":"), line=directive.line, option="tres-per-task")
            if found is not None:
                gpu_forms["gpus-per-task"] = (found, directive)
        else:
            gpu_forms[directive.option] = (parse_gpu_count(directive.value or "", line=directive.line, option=directive.option), directive)
    if len(gpu_forms) > 1:
        first, second = sorted((d for _f, d in gpu_forms.values()), key=lambda d: d.line)[-2:]
        raise DirectiveError(
            f"--{second.option} and --{first.option} (line {first.line}) both ask for GPUs; the portal cannot tell "
            "which count Slurm would allocate: keep one",
            line=second.line, option=second.option,
        )
    if gpu_forms:
        form, ((gpu_type, count), _directive) = next(iter(gpu_forms.items()))
        request.gpu_form, request.gpu_type, request.gpu_count = form, gpu_type, count
    _refused_before_submission(get, request)
    if get("ntasks-per-gpu") and request.gpu_form == "gpus" and request.ntasks is None:
        request.ntasks = _positive(get("ntasks-per-gpu")) * request.gpu_count
    for option, attr in (("mem", "mem_mb"), ("mem-per-cpu", "mem_per_cpu_mb"), ("mem-per-gpu", "mem_per_gpu_mb")):
        if get(option):
            setattr(request, attr, parse_memory_mb(get(option).value or "", line=get(option).line, option=option))
    present = [o for o in ("mem", "mem-per-cpu", "mem-per-gpu") if get(o)]
    if len(present) > 1:
        raise DirectiveError(
            "--mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive",
            line=max(get(o).line for o in present), option=present[-1],
        )
    if get("cpus-per-task") and get("cpus-per-gpu"):
        raise DirectiveError(
            "--cpus-per-task and --cpus-per-gpu are mutually exclusive",
            line=max(get("cpus-per-task").line, get("cpus-per-gpu").line), option="cpus-per-gpu",
        )
    if get("exclusive"):
        request.exclusive = (get("exclusive").value or "") not in ("user", "mcs", "topo")
    if get("oversubscribe") and get("exclusive"):
        raise DirectiveError("--exclusive and --oversubscribe options are mutually exclusive", line=get("oversubscribe").line, option="oversubscribe")
    if get("time"):
        request.time_limit_minutes = parse_time_minutes(get("time").value or "", line=get("time").line)
        request.time_unlimited = request.time_limit_minutes is None
    if get("array"):
        request.array = (get("array").value or "").strip()
        request.array_indexes, request.array_throttle = parse_array(request.array, line=get("array").line)
    for option, attr in (("output", "output"), ("error", "error"), ("chdir", "chdir")):
        if get(option):
            setattr(request, attr, get(option).value or "")
    return request
