"""The job spec's fields one by one, before the inventory: names, numbers, the script, the
environment, paths; and the error collector that names a field or a script line (jobs.spec)."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any

from gpuportal_sbatch.directives import Directive, DirectiveError, parse_directives

from jobs.job_fields import FIELD_OF_OPTION

JOB_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}\Z")  # no spaces: names end up in file names and CLI tables
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")  # \Z: "$" would also take a trailing newline
CONTROL_CHARS_RE = re.compile(r"[\x00-\x1f\x7f]")
MAX_SCRIPT_BYTES = 1024 * 1024
MAX_ENV_ENTRIES = 64
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_GPUS = 10_000  # sanity bound before the inventory check (keeps error messages readable)
DEFAULT_SHEBANG = "#!/bin/bash\n"
DEFAULT_JOB_NAME = "sbatch"  # what sbatch calls a job read from stdin without --job-name

# The largest value the job and template columns (PostgreSQL integer) hold: a larger number is the
# client's error (400), never the database's (500).
MAX_INT_FIELD = 2**31 - 1


def _as_int(
    value: Any, name: str, errors: dict, *, minimum: int = 1, maximum: int = MAX_INT_FIELD, required: bool = True
) -> int | None:
    if value is None or value == "":
        if required:
            errors[name] = ["This field is required."]
        return None
    if isinstance(value, bool):
        errors[name] = ["Must be a whole number."]
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        errors[name] = ["Must be a whole number."]
        return None
    if isinstance(value, float) and value != number:
        errors[name] = ["Must be a whole number."]
        return None
    if number < minimum:
        errors[name] = [f"Must be at least {minimum}."]
        return None
    if number > maximum:
        errors[name] = [f"Must be at most {maximum}."]
        return None
    return number


@dataclass(frozen=True)
class ParsedScript:
    """A script's ``#SBATCH`` directives, read once per request (``parse_script``) and handed to
    whatever needs them: the form's fields and directive table, the estimate, the spec (and, stored
    on the job, the relay). ``text``: the script parsed (line ends normalised); ``error``: why sbatch
    would refuse it (``directives`` then empty)."""

    text: str
    directives: tuple[Directive, ...] = ()
    error: DirectiveError | None = None

    def shifted(self, lines: int) -> ParsedScript:
        """The same parse with every script line ``lines`` further down (a shebang put before it)."""
        if not lines:
            return self
        error = self.error and DirectiveError(self.error.message, line=self.error.line + lines if self.error.line else 0,
                                              option=self.error.option)  # fmt: skip
        return ParsedScript(self.text, tuple(Directive(d.option, d.value, d.line + lines if d.line else 0, d.text)
                                             for d in self.directives), error)  # fmt: skip


def parse_script(script: Any, parsed: ParsedScript | None = None) -> ParsedScript:
    """The one place jobs read a script's directives: ``parsed`` when it is this script's parse
    already (the caller parsed it earlier in the request), else a new parse."""
    text = script.replace("\r\n", "\n") if isinstance(script, str) else ""
    if parsed is not None and parsed.text == text:
        return parsed
    try:
        return ParsedScript(text, tuple(parse_directives(text)))
    except DirectiveError as exc:
        return ParsedScript(text, (), exc)


def _describe(directive: Directive) -> str:
    return f"line {directive.line}: #SBATCH {directive.text}" if directive.line else f"--{directive.option}"


class _Errors(dict):
    """Errors by field: a directive from the script is reported under ``script`` (naming its line),
    one from an API field under that field."""

    def add(self, field_name: str, message: str) -> None:
        self.setdefault(field_name, []).append(message)

    def directive(self, directive: Directive | None, message: str, *, fallback: str = "script", field: str = "") -> None:
        """``field``: the API field to name when the directive came from a field (default: the
        field of its option)."""
        if directive is None:
            self.add(fallback, message[:1].upper() + message[1:])
        elif directive.line:
            self.add("script", f"{_describe(directive)}: {message}")
        else:
            self.add(field or FIELD_OF_OPTION.get(directive.option, fallback), message[:1].upper() + message[1:])


def _clean_script(script: Any, errors: _Errors) -> str:
    if not isinstance(script, str) or not script.strip():
        errors.add("script", "The script is empty.")
    elif "\x00" in script:
        errors.add("script", "The script must not contain NUL bytes.")
    elif len(script.encode("utf-8", errors="surrogatepass")) > MAX_SCRIPT_BYTES:
        errors.add("script", f"The script is larger than {MAX_SCRIPT_BYTES // 1024} KiB.")
    else:
        script = script.replace("\r\n", "\n")  # scripts pasted from Windows break bash otherwise
        if not script.startswith("#!"):
            script = DEFAULT_SHEBANG + script
        return script
    return ""


def _clean_environment(environment: Any, errors: _Errors) -> dict[str, str]:
    env_clean: dict[str, str] = {}
    if environment is None:
        return env_clean
    if not isinstance(environment, dict):
        errors.add("environment", "Give an object of NAME: value pairs.")
    elif len(environment) > MAX_ENV_ENTRIES:
        errors.add("environment", f"At most {MAX_ENV_ENTRIES} variables.")
    else:
        for key, value in environment.items():
            if not isinstance(key, str) or not ENV_NAME_RE.match(key):
                errors.add("environment", f"Invalid variable name {key!r}: use letters, digits and '_', not starting with a digit.")
            elif not isinstance(value, (str, int, float)) or isinstance(value, bool):
                errors.add("environment", f"{key}: the value must be a string.")
            elif "\x00" in str(value) or len(str(value).encode()) > MAX_ENV_VALUE_BYTES:
                errors.add("environment", f"{key}: the value must not contain NUL bytes or exceed 32 KiB.")
            else:
                env_clean[key] = str(value)
    return env_clean


def _path_ok(path: str) -> bool:
    return len(path) <= 1024 and not CONTROL_CHARS_RE.search(path)


def _absolute(path: str, base: str) -> str:
    return posixpath.normpath(path if path.startswith("/") else posixpath.join(base, path))
