"""The CLI's pure parsers for its flags: Slurm time limits, memory sizes, GPU requests."""

from __future__ import annotations

import pytest

from gpuportal_cli.sbatch import gpu_request, parse_memory_gb, parse_time_minutes


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        # every sbatch --time format
        ("5", 5),
        ("90", 90),
        ("10:30", 11),  # M:S, seconds round up
        ("0:30", 1),
        ("1:30:00", 90),
        ("01:00:01", 61),
        ("2-00:00:00", 2880),
        ("1-12", 2160),  # D-H
        ("1-2:30", 1590),  # D-H:M
        ("0-0:0:59", 1),
        # the short forms the CLI accepts too
        ("2h", 120),
        ("90m", 90),
        ("90min", 90),
        ("1h30m", 90),
        ("2d", 2880),
        ("1d12h", 2160),
        ("45s", 1),
        (" 2H ", 120),
    ],
)
def test_parse_time_minutes_accepts_slurm_and_short_formats(text, minutes):
    assert parse_time_minutes(text) == minutes


@pytest.mark.parametrize("text", ["", "0", "0:00", "abc", "1:2:3:4", "1-", "-5", "x-1", "1h30", "UNLIMITED", "infinite", "1.5h"])
def test_parse_time_minutes_refuses_bad_or_unlimited_values(text):
    with pytest.raises(ValueError):
        parse_time_minutes(text)


@pytest.mark.parametrize(
    ("text", "gb"),
    [("32G", 32), ("32g", 32), ("32GB", 32), ("64000M", 63), ("64000", 63), ("1024", 1), ("1", 1), ("1T", 1024), ("512K", 1)],
)
def test_parse_memory_gb_rounds_up_to_whole_gib(text, gb):
    assert parse_memory_gb(text) == gb


@pytest.mark.parametrize("text", ["", "0", "0G", "lots", "32X", "1.5G"])  # 1.5G: sbatch refuses it too
def test_parse_memory_gb_refuses_bad_sizes(text):
    with pytest.raises(ValueError):
        parse_memory_gb(text)


@pytest.mark.parametrize(("text", "expected"), [("2", ("", 2)), ("a100:2", ("a100", 2)), ("h100", ("h100", 1))])
def test_gpu_request(text, expected):
    assert gpu_request(text) == expected


@pytest.mark.parametrize("text", ["", "a:b:2", "2x", "a100:"])
def test_gpu_request_refuses_garbage(text):
    with pytest.raises(ValueError):
        gpu_request(text)


# #SBATCH lines: tests/sbatch/ (the one parser, gpuportal_sbatch, shared with the server)
