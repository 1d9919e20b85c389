"""The one #SBATCH parser (gpuportal_sbatch.directives): every option form sbatch reads (any release:
per-release reading is tests/sbatch/test_releases.py)."""

from __future__ import annotations

import pytest

from gpuportal_sbatch.directives import (
    Directive,
    DirectiveError,
    apply_overrides,
    disable_directives,
    option_table,
    parse_array,
    parse_directives,
    parse_memory_mb,
    parse_time_minutes,
    resolve_option,
    script_request,
)
from gpuportal_sbatch.options import OPTIONS, RELEASES


def opts(script: str) -> list[tuple[str, str | None]]:
    return [(d.option, d.value) for d in parse_directives(script)]


def test_block_ends_at_the_first_command_and_skips_comments_and_blank_lines():
    script = "#!/bin/bash\n\n# a comment\n#SBATCH --time=5\n   # indented comment\n#SBATCH -N 2\necho hi\n#SBATCH --gpus=4\n"
    assert opts(script) == [("time", "5"), ("nodes", "2")]


def test_indented_sbatch_is_a_comment_and_old_slurm_magic_word_counts():
    assert opts("  #SBATCH --time=5\n#SLURM --time=7\n") == [("time", "7")]


def test_several_options_on_a_line_with_equals_or_space():
    assert opts("#SBATCH --time 10 --nodes=2 --job-name train\n") == [("time", "10"), ("nodes", "2"), ("job-name", "train")]


def test_a_value_may_come_from_the_next_directive_line():
    assert opts("#SBATCH --time\n#SBATCH 10\n") == [("time", "10")]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("-N 2", ("nodes", "2")), ("-N2", ("nodes", "2")), ("-G 4", ("gpus", "4")), ("-c 8", ("cpus-per-task", "8")),
        ("-n 16", ("ntasks", "16")), ("-t 15", ("time", "15")), ("-p debug", ("partition", "debug")),
        ("-A vision", ("account", "vision")), ("-q high", ("qos", "high")), ("-C a100", ("constraint", "a100")),
        ("-J train", ("job-name", "train")), ("-o out.%j", ("output", "out.%j")), ("-e err.%j", ("error", "err.%j")),
        ("-D .", ("chdir", ".")), ("-a 0-5", ("array", "0-5")), ("-a0-5%2", ("array", "0-5%2")),
        ("-w a100-01", ("nodelist", "a100-01")), ("-x h100-01", ("exclude", "h100-01")), ("-d afterok:1", ("dependency", "afterok:1")),
        ("-b now+1hour", ("begin", "now+1hour")), ("-L foo:1", ("licenses", "foo:1")), ("-m block", ("distribution", "block")),
        ("-S 1", ("core-spec", "1")), ("-B 2:4:1", ("extra-node-info", "2:4:1")), ("-i in.txt", ("input", "in.txt")),
    ],
)
def test_short_options(text, expected):
    assert opts(f"#SBATCH {text}\n") == [expected]


def test_clustered_flags_and_optional_values():
    assert opts("#SBATCH -vO -k\n") == [("verbose", None), ("overcommit", None), ("no-kill", None)]
    assert opts("#SBATCH --exclusive\n#SBATCH --requeue\n") == [("exclusive", None), ("requeue", None)]
    assert opts("#SBATCH --exclusive=user\n") == [("exclusive", "user")]


def test_optional_value_is_only_taken_after_equals():
    with pytest.raises(DirectiveError, match="invalid directive found in batch script: user") as exc:
        parse_directives("#SBATCH --exclusive user\n")
    assert exc.value.line == 1


def test_unambiguous_abbreviations_and_ambiguous_ones():
    assert opts("#SBATCH --part=debug --ntasks-per-n=2 --cpus-per-t=4\n") == [
        ("partition", "debug"), ("ntasks-per-node", "2"), ("cpus-per-task", "4"),
    ]
    with pytest.raises(DirectiveError) as exc:
        parse_directives("#SBATCH --time=5\n#SBATCH --nod=2\n")
    assert exc.value.line == 2
    assert "'--nod' is ambiguous; possibilities: '--nodefile' '--nodelist' '--nodes'" in str(exc.value)


def test_quotes_escapes_and_comments():
    assert opts('#SBATCH --job-name="my job" --comment=\'a # b\' # trailing\n') == [("job-name", "my job"), ("comment", "a # b")]
    assert opts("#SBATCH --time=5#no space needed\n") == [("time", "5")]
    assert opts("#SBATCH --output=a\\ b.out\n") == [("output", "a b.out")]
    with pytest.raises(DirectiveError, match="unmatched"):
        parse_directives('#SBATCH --job-name="open\n')


def test_unknown_options_name_the_line():
    with pytest.raises(DirectiveError) as exc:
        parse_directives("#!/bin/bash\n#SBATCH --time=5\n#SBATCH --gpu-count=2\n")
    assert (exc.value.line, exc.value.message) == (3, "unrecognized option '--gpu-count'")
    with pytest.raises(DirectiveError, match="invalid option -- 'g'"):
        parse_directives("#SBATCH -g 2\n")
    with pytest.raises(DirectiveError, match="requires an argument"):
        parse_directives("#SBATCH --time\n")
    with pytest.raises(DirectiveError, match="doesn't allow an argument"):
        parse_directives("#SBATCH --hold=yes\n")
    with pytest.raises(DirectiveError, match="invalid directive found in batch script: stray"):
        parse_directives("#SBATCH stray\n")


def test_hetjob_separators_are_refused_on_purpose():
    with pytest.raises(DirectiveError, match="heterogeneous") as exc:
        parse_directives("#SBATCH -N 1\n#SBATCH hetjob\n#SBATCH -N 2\n")
    assert exc.value.line == 2


def test_the_table_knows_every_sbatch_option_of_22_05_and_25_11():
    assert RELEASES == ("22.05", "25.11") and len(OPTIONS) >= 115
    table = option_table()  # any release
    for name in ("gres", "gpus", "gpus-per-node", "gpus-per-task", "cpus-per-gpu", "mem-per-gpu", "ntasks-per-node",
                 "array", "exclusive", "signal", "requeue", "mail-type", "mail-user", "chdir", "qos", "constraint",
                 "power", "tres-per-task", "wckey", "open-mode"):  # fmt: skip
        assert name in table.has_arg, name
    assert table.short["G"] == "gpus" and table.short["c"] == "cpus-per-task" and table.short["a"] == "array"
    for release in (None, *RELEASES):
        for name in option_table(release).has_arg:
            assert resolve_option(name, release=release) == name  # an exact name is never ambiguous


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("5", 5), ("0:30", 1), ("10:30", 11), ("1:30:00", 90), ("2-0", 2880), ("1-2:30", 1590), ("1-0:0:1", 1441), ("UNLIMITED", None), ("0", None)],
)
def test_time_formats(text, minutes):
    assert parse_time_minutes(text) == minutes


@pytest.mark.parametrize("text", ["", "abc", "1h", "1:2:3:4", "1-", "-5"])
def test_bad_times(text):
    with pytest.raises(DirectiveError):
        parse_time_minutes(text, line=4)


@pytest.mark.parametrize(("text", "mb"), [("0", 0), ("512", 512), ("4G", 4096), ("4g", 4096), ("1T", 1048576), ("100K", 1), ("16GB", 16384)])
def test_memory(text, mb):
    assert parse_memory_mb(text) == mb


def test_array_ranges_steps_lists_and_throttle():
    assert parse_array("0-5") == ([0, 1, 2, 3, 4, 5], None)
    assert parse_array("1,3,5-7%2") == ([1, 3, 5, 6, 7], 2)
    assert parse_array("0-15:4") == ([0, 4, 8, 12], None)
    for bad in ("5-1", "a-b", "1-3%x", ""):
        with pytest.raises(DirectiveError):
            parse_array(bad)


def gpus_of(script: str, *, per_node: int = 4) -> int:
    request = script_request(parse_directives(script))
    nodes = request.nodes_for()
    return request.gpus_total(nodes=nodes, gpus_per_node=per_node)


@pytest.mark.parametrize(
    ("script", "gpus"),
    [
        ("#SBATCH --gres=gpu:a100:2\n", 2),
        ("#SBATCH --gres=gpu:2 -N 2\n", 4),
        ("#SBATCH --gres=gpu\n", 1),
        ("#SBATCH --gres=gpu:a100:1,tmpdisk:10\n", 1),
        ("#SBATCH -G 3\n#SBATCH -N 2\n", 3),
        ("#SBATCH --gpus=h100:2\n", 2),
        ("#SBATCH --gpus-per-node=2 --nodes=2\n", 4),
        ("#SBATCH --ntasks=3 --gpus-per-task=2\n", 6),
        ("#SBATCH --nodes=2 --ntasks-per-node=2 --gpus-per-task=1\n", 4),
        ("#SBATCH --exclusive --gres=gpu:a100:1\n", 4),
        ("#SBATCH --exclusive -N 2 --gres=gpu:1\n", 8),
        ("#SBATCH --exclusive=user --gres=gpu:1\n", 1),
        ("#SBATCH -N 1-2 --gres=gpu:2\n", 4),
        ("#SBATCH --time=5\n", 0),
    ],
)
def test_gpus_one_job_is_allocated(script, gpus):
    assert gpus_of(script) == gpus


def test_request_reads_tasks_memory_array_and_paths():
    request = script_request(parse_directives(
        "#SBATCH -n 8 --ntasks-per-node=4 -c 2 --mem=0 --array=0-9%3 -o logs/%x-%A_%a.out -e e.txt -D work -t 1-0\n"
    ))  # fmt: skip
    assert (request.ntasks, request.ntasks_per_node, request.cpus_per_task) == (8, 4, 2)
    assert request.nodes_for() == 2 and request.mem_mb == 0
    assert (request.array_tasks, request.array_throttle) == (10, 3)
    assert (request.output, request.error, request.chdir, request.time_limit_minutes) == ("logs/%x-%A_%a.out", "e.txt", "work", 1440)


@pytest.mark.parametrize(
    ("script", "line", "words"),
    [
        ("#SBATCH --mem=4G\n#SBATCH --mem-per-cpu=1G\n", 2, "mutually exclusive"),
        ("#SBATCH -c 4\n#SBATCH --cpus-per-gpu=2\n", 2, "mutually exclusive"),
        ("#SBATCH --gres=gpu:2\n#SBATCH --gpus=4\n", 2, "both ask for GPUs"),
        ("#SBATCH --time=soon\n", 1, "invalid time limit"),
        ("#SBATCH\n#SBATCH --nodes=0\n", 2, "node count"),
        ("#SBATCH --ntasks=x\n", 1, "positive whole number"),
    ],
)
def test_request_refusals_name_the_line(script, line, words):
    with pytest.raises(DirectiveError, match=words) as exc:
        script_request(parse_directives(script))
    assert exc.value.line == line


def test_overrides_replace_the_option_and_its_mutually_exclusive_ones():
    script = "#!/bin/bash\n#SBATCH --gres=gpu:a100:2\n#SBATCH --cpus-per-task=4\n#SBATCH --time=00:05:00\n#SBATCH --mem-per-cpu=2G\n"
    directives = parse_directives(script)
    overrides = [Directive("cpus-per-gpu", "2", 0, "--cpus-per-gpu=2"), Directive("mem", "8G", 0, "--mem=8G")]
    effective = apply_overrides(directives, overrides)
    assert [(d.option, d.value) for d in effective] == [
        ("gres", "gpu:a100:2"), ("time", "00:05:00"), ("cpus-per-gpu", "2"), ("mem", "8G"),
    ]
    replaced = {d.line for d in directives} - {d.line for d in effective}
    rewritten = disable_directives(script, replaced)
    assert opts(rewritten) == [("gres", "gpu:a100:2"), ("time", "00:05:00")]
    assert "# [gpuportal: replaced] SBATCH --cpus-per-task=4" in rewritten
