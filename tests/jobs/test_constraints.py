"""jobs.constraints: a --constraint expression is refused only when it certainly cannot match."""

from __future__ import annotations

import pytest

from jobs.constraints import unmatched

# a100-01, a100-02: a100, ib, nvlink; h100-01: h100, ib
NODES = [("a100", "ib", "nvlink"), ("a100", "ib", "nvlink"), ("h100", "ib")]


@pytest.mark.parametrize(
    ("expression", "missing"),
    [
        ("a100", []),
        ("nvlink", []),
        ("a100&ib", []),
        ("a100,ib", []),
        ("a100|v100", []),  # one branch is enough
        ("v100|a100", []),
        ("[a100|h100]", []),  # matching OR
        ("[a100*2&h100*1]", []),  # different nodes, different features
        ("(a100|h100)&ib", []),
        ("ib*3", []),
        ("v100", ["v100"]),
        ("a100&v100", ["v100"]),
        ("v100|p100", ["v100", "p100"]),
        ("[a100*2&h100*2]", ["h100*2"]),  # one node has h100
        ("ib*4", ["ib*4"]),
        ("(v100|a100)&(x|y)", ["x", "y"]),
        (" a100 & ib ", []),
        ("NVLink", []),
    ],
)
def test_only_what_certainly_cannot_match_is_refused(expression, missing):
    assert unmatched(expression, NODES) == missing


@pytest.mark.parametrize("expression", ["[a100", "a100&", "a100!ib", "a100)", "", "a100 ib"])
def test_what_cannot_be_read_is_left_to_slurm(expression):
    assert unmatched(expression, NODES) is None


def test_a_partition_without_features_matches_no_feature():
    assert unmatched("a100", [(), ()]) == ["a100"]
