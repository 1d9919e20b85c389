"""The CLI's exit codes (documented in --help by EXIT_CODES_HELP), its one error type and the exit code
for an API error or a job's final state."""

from __future__ import annotations

from gpuportal_cli.client import ApiError


# Exit codes (documented in --help; keep EXIT_CODES_HELP in step).
EXIT_OK = 0
EXIT_JOB_FAILED = 1  # --wait: the job ended FAILED (non-zero exit code)
EXIT_JOB_ENDED_OTHERWISE = 2  # --wait: CANCELLED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, PREEMPTED, …
EXIT_SUBMIT_FAILED = 3  # --wait: Slurm refused the job (SUBMIT_FAILED)
EXIT_USAGE = 64  # bad arguments or an unreadable script
EXIT_REFUSED = 65  # the portal refused the request (400, 404, 409, …)
EXIT_UNAVAILABLE = 69  # the portal could not be reached, failed (5xx) or did not answer as the API (not JSON, a redirect)
EXIT_AUTH = 77  # not logged in, invalid or revoked token, or not allowed (401/403)
EXIT_INTERRUPTED = 130
EXIT_CODES_HELP = """\
exit codes:
  0    success; with --wait: the job COMPLETED
  1    with --wait: the job FAILED
  2    with --wait: the job ended otherwise (CANCELLED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, ...)
  3    with --wait: Slurm refused the job (SUBMIT_FAILED)
  64   bad arguments or an unreadable script
  65   the portal refused the request (invalid input, not found, conflict); field errors are printed
  69   the portal could not be reached, had an internal error, or did not answer as its API does
       (not JSON, a redirect that is not followed)
  77   not logged in, token invalid or revoked, or permission denied
  130  interrupted (a job you were waiting for keeps running)

environment:
  GPUPORTAL_URL, GPUPORTAL_TOKEN override the stored login
  XDG_CONFIG_HOME  the login is kept in $XDG_CONFIG_HOME/gpuportal/config.json (default ~/.config)
"""


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


def exit_code_for_api_error(error: ApiError) -> int:
    if not error.from_api or error.status == 0 or error.status >= 500:
        return EXIT_UNAVAILABLE
    if error.status in (401, 403):
        return EXIT_AUTH
    return EXIT_REFUSED


def exit_code_for_state(state: str) -> int:
    if state == "COMPLETED":
        return EXIT_OK
    if state == "FAILED":
        return EXIT_JOB_FAILED
    if state == "SUBMIT_FAILED":
        return EXIT_SUBMIT_FAILED
    return EXIT_JOB_ENDED_OTHERWISE
