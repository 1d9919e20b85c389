"""gpuportal_cli.output: _json_or_empty, the first step of the `teams` and `jobs` listings; _exit_line,
a job's exit code and the signal that ended it as `status` and `submit --wait` print them."""

from __future__ import annotations

import json

from gpuportal_cli.output import _exit_line, _json_or_empty, _state_line


def test_json_or_empty_prints_json_even_of_no_items(capsys):
    assert _json_or_empty([{"slug": "nlp"}], as_json=True, empty="none") is True
    assert json.loads(capsys.readouterr().out) == [{"slug": "nlp"}]
    assert _json_or_empty([], as_json=True, empty="none") is True
    assert json.loads(capsys.readouterr().out) == []


def test_json_or_empty_says_empty_or_leaves_the_table_to_the_caller(capsys):
    assert _json_or_empty([], as_json=False, empty="No jobs yet.") is True
    assert capsys.readouterr().out == "No jobs yet.\n"
    assert _json_or_empty([{"id": 1}], as_json=False, empty="No jobs yet.") is False
    assert capsys.readouterr().out == ""


def test_exit_line_gives_the_signal_in_the_portals_words():
    killed = {"exit_code": 0, "exit_signal": 9, "exit_signal_text": "signal 9 (SIGKILL)"}
    assert _exit_line(killed) == "0, signal 9 (SIGKILL)"
    assert _exit_line({"exit_code": 0, "exit_signal": 53}) == "0, signal 53"  # a portal without the words
    assert _exit_line({"exit_code": 3, "exit_signal": 0, "exit_signal_text": ""}) == "3"
    assert _exit_line({"exit_code": 3}) == "3"  # a portal before exit_signal
    assert _exit_line({"exit_code": None, "exit_signal": None}) == ""
    assert _state_line({"state": "FAILED", "slurm_job_id": 7, **killed}).endswith("FAILED (Slurm job 7; exit code 0, signal 9 (SIGKILL))")
