"""sbatch per Slurm release (gpuportal_sbatch): the generated table's releases, a script read as one
release's sbatch reads it (options, abbreviations, values), what a release lacks refused naming it,
and the generator on a small slurm_opt.c of its own. The table against the real `sbatch --help` of
both local clusters: tests/sbatch/test_sbatch_help.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gpuportal_sbatch.directives import DirectiveError, option_table, parse_directives, release_of, release_problems
from gpuportal_sbatch.options import OPTIONS, RELEASES, REQUIRED

ROOT = Path(__file__).resolve().parents[2]

# real differences between Debian's 22.05.8 and 25.11.7 (src/common/slurm_opt.c of each)
ONLY_25_11 = "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --ntasks=2\n#SBATCH --tres-per-task=gres/gpu:1\n"


def opts(script: str, release: str | None) -> list[tuple[str, str | None]]:
    return [(d.option, d.value) for d in parse_directives(script, release)]


def test_the_table_has_both_local_releases_and_the_options_that_differ():
    assert RELEASES == ("22.05", "25.11")
    old, new = option_table("22.05").has_arg, option_table("25.11").has_arg
    assert {"tres-per-task", "extra", "oom-kill-step", "segment", "stepmgr"} <= set(new) - set(old)
    assert set(old) - set(new) == {"power"}
    assert (old["requeue"], new["requeue"]) == ("none", "optional")


def test_no_option_takes_a_required_value_in_one_release_and_not_in_another():
    """Reading a script for any release is then well defined: the next word is a value in every
    release or in none (only '=value' can differ, and 'any release' allows it)."""
    required: dict[str, set] = {}
    for name, has_arg, _short, _releases in OPTIONS:
        required.setdefault(name, set()).add(has_arg == REQUIRED)
    assert [name for name, kinds in required.items() if len(kinds) > 1] == []


def test_an_option_only_25_11_has_is_refused_for_22_05_naming_the_release_and_the_line():
    with pytest.raises(DirectiveError) as exc:
        parse_directives(ONLY_25_11, "22.05")
    assert str(exc.value) == "line 4: sbatch of Slurm 22.05 has no option --tres-per-task (25.11 has it)"
    assert exc.value.option == "tres-per-task"
    assert opts(ONLY_25_11, "25.11")[-1] == ("tres-per-task", "gres/gpu:1")
    assert opts(ONLY_25_11, None)[-1] == ("tres-per-task", "gres/gpu:1")  # the CLI: any release


def test_an_option_only_22_05_has_is_refused_for_25_11_and_an_abbreviation_names_the_option():
    with pytest.raises(DirectiveError, match=r"^line 2: sbatch of Slurm 25.11 has no option --power \(22.05 has it\)$"):
        parse_directives("#!/bin/bash\n#SBATCH --power=level\n", "25.11")
    with pytest.raises(DirectiveError, match=r"sbatch of Slurm 22.05 has no option --tres-per-t \(25.11 has --tres-per-task\)"):
        parse_directives("#SBATCH --tres-per-t=gres/gpu:1\n", "22.05")


def test_abbreviations_resolve_against_the_release_s_own_options():
    # 22.05 has one option starting "ext" (--extra-node-info); 25.11 also has --extra and --external
    assert opts("#SBATCH --ext=2:4\n", "22.05") == [("extra-node-info", "2:4")]
    for release in ("25.11", None):
        with pytest.raises(DirectiveError, match="'--ext' is ambiguous"):
            parse_directives("#SBATCH --ext=2:4\n", release)
    # --oom only abbreviates a 25.11 option
    assert opts("#SBATCH --oom\n", "25.11") == [("oom-kill-step", None)]
    # --extra: 25.11's option, and in 22.05 an abbreviation of --extra-node-info (22.05.8's sbatch:
    # 'Invalid numeric value "x" for first arg of -B')
    assert opts("#SBATCH --extra=x\n", "22.05") == [("extra-node-info", "x")]
    assert opts("#SBATCH --extra=x\n", "25.11") == opts("#SBATCH --extra=x\n", None) == [("extra", "x")]


def test_a_name_that_means_another_option_in_the_cluster_s_release_is_refused_naming_both():
    """The server read --extra (before it knew the cluster) as 25.11's --extra; 22.05's sbatch would
    read it as --extra-node-info: refused, rather than sending what the script did not mean."""
    ((directive, problem),) = release_problems(parse_directives("#!/bin/bash\n#SBATCH --extra=x\n"), "22.05")
    assert directive.option == "extra" and problem.line == 2
    assert problem.message == (
        "sbatch of Slurm 22.05 reads --extra as --extra-node-info, not as --extra (25.11 has it): "
        "write --extra-node-info if that is meant"
    )
    assert release_problems(parse_directives("#SBATCH --extra-node-info=2\n#SBATCH --extra=x\n"), "25.11") == []


def test_a_value_after_equals_follows_the_release_s_has_arg():
    assert opts("#SBATCH --requeue=1\n", "25.11") == [("requeue", "1")]
    with pytest.raises(DirectiveError, match="'--requeue' doesn't allow an argument"):
        parse_directives("#SBATCH --requeue=1\n", "22.05")
    assert opts("#SBATCH --get-user-env=10L\n", "22.05") == [("get-user-env", "10L")]
    with pytest.raises(DirectiveError, match="'--get-user-env' doesn't allow an argument"):
        parse_directives("#SBATCH --get-user-env=10L\n", "25.11")


@pytest.mark.parametrize(
    "script",
    [
        ONLY_25_11,
        "#SBATCH --power=level -N1\n",
        "#SBATCH --tres-per=gres/gpu:1 -n 2\n#SBATCH --requeue=1\n",
        "#SBATCH --get-user-env=10L --oom-kill-step\n#SBATCH -G 1 --extra=x\n",
        "#SBATCH -N 2 --time 10 --gpus=a100:2\n",
    ],
)
@pytest.mark.parametrize("release", RELEASES)
def test_release_problems_of_a_script_read_for_any_release_are_what_parsing_for_that_release_refuses(script, release):
    """The server reads a script before it knows the cluster, then checks it against the cluster's
    release: the same first refusal as reading it for that release, or none when that accepts it."""
    problems = release_problems(parse_directives(script), release)
    try:
        parse_directives(script, release)
    except DirectiveError as exc:
        assert problems and str(problems[0][1]) == str(exc)
        assert problems[0][0].line == exc.line
    else:
        assert problems == []


def test_a_cluster_s_version_maps_to_the_table_s_release():
    assert [release_of(v) for v in ("22.05.8", "25.11.7", "25.11", "24.05.3", "", None, "slurm")] == [
        "22.05", "25.11", "25.11", None, None, None, None,
    ]  # fmt: skip
    assert release_problems(parse_directives(ONLY_25_11), None) == []  # an unknown release: every release's options
    with pytest.raises(ValueError, match="no sbatch option table for Slurm '24.05'"):
        option_table("24.05")


SLURM_OPT_C = """\
static slurm_cli_opt_t slurm_opt_account = {
\t.name = "account",
\t.has_arg = required_argument,
\t.val = 'A',
\t.set_func = arg_set_account,
\t.get_func = arg_get_account,
};
static slurm_cli_opt_t slurm_opt_wrap = {
\t.name = "wrap",
\t.has_arg = required_argument,
\t.val = LONG_OPT_WRAP,
\t.set_func_sbatch = arg_set_wrap,
};
static slurm_cli_opt_t slurm_opt_pty = {
\t.name = "pty",
\t.has_arg = no_argument,
\t.val = LONG_OPT_PTY,
\t.set_func_srun = arg_set_pty,
};
static slurm_cli_opt_t slurm_opt_x11 = {
#ifdef WITH_SLURM_X11
\t.name = "x11",
#else
\t.name = NULL,
#endif
\t.has_arg = optional_argument,
\t.val = LONG_OPT_X11,
\t.set_func = arg_set_x11,
};
static slurm_cli_opt_t slurm_opt_%(extra)s = {
\t.name = "%(extra)s",
\t.has_arg = %(extra_arg)s,	/* sort of */
\t.val = LONG_OPT_EXTRA,
\t.set_func_sbatch = arg_set_extra,
};
static slurm_cli_opt_t slurm_opt_unlisted = {
\t.name = "unlisted",
\t.has_arg = no_argument,
\t.set_func = arg_set_unlisted,
};
static const slurm_cli_opt_t *common_options[] = {
\t&slurm_opt_account,
\t&slurm_opt_wrap,
\t&slurm_opt_pty,
\t&slurm_opt_x11,
\t&slurm_opt_%(extra)s,
\tNULL /* END */
};
"""


def test_the_generator_reads_sbatch_s_options_from_each_release_s_slurm_opt_c(tmp_path):
    """An option is sbatch's when common_options[] lists it with a name and a set_func or
    set_func_sbatch (not srun's --pty, not one left out of the list, not x11 built without X11)."""
    spec = importlib.util.spec_from_file_location("generate_options", ROOT / "sbatch" / "generate_options.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    for release, extra, extra_arg in (("22.05", "power", "required_argument"), ("25.11", "requeue", "optional_argument")):
        (tmp_path / release / "src" / "common").mkdir(parents=True)
        text = SLURM_OPT_C % {"extra": extra, "extra_arg": extra_arg}
        (tmp_path / release / "src" / "common" / "slurm_opt.c").write_text(text)
    out = tmp_path / "options.py"
    assert generator.main([f"22.05={tmp_path / '22.05'}", f"25.11={tmp_path / '25.11'}", "--out", str(out)]) == 0
    table: dict = {}
    exec(compile(out.read_text(), str(out), "exec"), table)
    assert table["RELEASES"] == ("22.05", "25.11")
    assert table["OPTIONS"] == (
        ("account", REQUIRED, "A", ("22.05", "25.11")),
        ("power", REQUIRED, "", ("22.05",)),
        ("requeue", "optional", "", ("25.11",)),
        ("wrap", REQUIRED, "", ("22.05", "25.11")),
    )
    assert generator.main([f"22.05={tmp_path / '22.05'}", f"25.11={tmp_path / '25.11'}", "--out", str(out), "--check"]) == 0
    out.write_text(out.read_text().replace("'A'", "'a'"))
    assert generator.main([f"22.05={tmp_path / '22.05'}", f"25.11={tmp_path / '25.11'}", "--out", str(out), "--check"]) == 1


def test_the_committed_table_says_which_sources_it_was_generated_from():
    head = (ROOT / "sbatch" / "gpuportal_sbatch" / "options.py").read_text()[:600]
    assert "GENERATED by sbatch/generate_options.py" in head
    assert "22.05 (Slurm 22.05.8), 25.11 (Slurm 25.11.7)" in head
