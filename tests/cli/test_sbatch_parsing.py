"""The CLI's pure parsers: Slurm time limits, memory sizes, GPU requests and #SBATCH lines."""

from __future__ import annotations

import pytest

from gpuportal_cli.sbatch import gpu_request, parse_memory_gb, parse_sbatch, parse_time_minutes


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
    [("32G", 32), ("32g", 32), ("32GB", 32), ("64000M", 63), ("64000", 63), ("1024", 1), ("1", 1), ("1T", 1024), ("1.5G", 2), ("512K", 1)],
)
def test_parse_memory_gb_rounds_up_to_whole_gib(text, gb):
    assert parse_memory_gb(text) == gb


@pytest.mark.parametrize("text", ["", "0", "0G", "lots", "32X"])
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


def test_parse_sbatch_reads_common_directives():
    script = """#!/bin/bash
#SBATCH --job-name=train
#SBATCH --partition=debug
#SBATCH --gres=gpu:a100:2
#SBATCH --time=1:30:00
#SBATCH --mem=32G
#SBATCH --cpus-per-gpu=4
#SBATCH --chdir=/scratch/me
python train.py
"""
    parsed = parse_sbatch(script)
    assert parsed.as_api_fields() == {
        "name": "train",
        "partition": "debug",
        "gpu_type": "a100",
        "gpus": 2,
        "time_limit_minutes": 90,
        "memory_gb": 32,
        "cpus_per_gpu": 4,
        "workdir": "/scratch/me",
    }
    assert parsed.ignored == [] and parsed.problems == []


def test_parse_sbatch_short_options_spaces_and_several_per_line():
    script = "#!/bin/sh\n#SBATCH -J 'my job' -p gpu -N 2\n#SBATCH -t 2-00:00:00 -G h100:4\n#SBATCH -t90\necho\n"
    parsed = parse_sbatch(script)
    assert parsed.name == "my job"
    assert parsed.partition == "gpu"
    assert parsed.nodes == 2
    assert parsed.time_limit_minutes == 90  # the later line wins, as in sbatch
    assert (parsed.gpu_type, parsed.gpus) == ("h100", 4)  # --gpus/-G is the job's total


def test_parse_sbatch_per_node_gres_is_multiplied_by_nodes():
    parsed = parse_sbatch("#SBATCH --nodes=2\n#SBATCH --gres=gpu:3\n")
    assert parsed.gpus_per_node == 3 and parsed.gpu_type is None
    assert parsed.total_gpus() == 6
    assert parsed.total_gpus(nodes=4) == 12  # the command line's --nodes overrides the script's
    assert parsed.as_api_fields()["gpus"] == 6


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("#SBATCH --gres=gpu:a100:1", ("a100", 1)),
        ("#SBATCH --gres=gpu", (None, 1)),
        ("#SBATCH --gres=gpu:2,shard:1", (None, 2)),
        ("#SBATCH --gpus=2", (None, 2)),
        ("#SBATCH --gpus a100:2", ("a100", 2)),
        ("#SBATCH --gpus-per-node=h100:2", ("h100", 2)),
        ("#SBATCH -G 3", (None, 3)),
        ("#SBATCH -G3", (None, 3)),
    ],
)
def test_parse_sbatch_gpu_forms(line, expected):
    parsed = parse_sbatch(line + "\n")
    assert (parsed.gpu_type, parsed.total_gpus()) == expected


def test_parse_sbatch_stops_at_first_command_and_ignores_comments():
    script = """#!/bin/bash
# a comment mentioning --time=999
#SBATCH --time=5   # five minutes
##SBATCH --time=7
#SBATCHX --time=8

echo start
#SBATCH --time=60
"""
    assert parse_sbatch(script).time_limit_minutes == 5


def test_parse_sbatch_lists_ignored_and_unreadable_directives():
    parsed = parse_sbatch("#SBATCH --mail-type=END --gres=shard:1\n#SBATCH --time=forever\n#SBATCH --mem\n")
    assert parsed.ignored == ["--mail-type=END", "--gres=shard:1"]
    assert len(parsed.problems) == 2 and "--time=forever" in parsed.problems[0]
    assert parsed.time_limit_minutes is None


def test_parse_sbatch_without_directives_gives_nothing():
    parsed = parse_sbatch("#!/bin/bash\necho hi\n")
    assert parsed.as_api_fields() == {}
