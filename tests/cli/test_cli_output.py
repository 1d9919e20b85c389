"""gpuportal_cli.output._json_or_empty: the first step of the `teams` and `jobs` listings."""

from __future__ import annotations

import json

from gpuportal_cli.output import _json_or_empty


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
