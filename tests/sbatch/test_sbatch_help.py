"""The generated option table against the real sbatch of both local clusters: Debian's 22.05
(/usr/bin/sbatch) and 25.11 built from the vendored tarball (scripts/cluster, tests.support's
slurm_command). Every option ``sbatch --help`` and ``--usage`` name is in the table of that
release, with the same letter, taking a value where the help shows one — but for what the help
names and that sbatch refuses as unrecognized (25.11.7's help still names --power); the table's
options the help does not name are exactly the known undocumented ones (so a wrong option in the
table, e.g. srun's, fails too)."""

from __future__ import annotations

import re

import pytest

from gpuportal_sbatch.directives import option_table, release_of
from gpuportal_sbatch.options import NONE
from tests.support import slurm_command, use_slurm_target

pytestmark = pytest.mark.slurm

# sbatch accepts these, but neither its --help nor its --usage names them
UNDOCUMENTED = {
    "22.05": {
        "acctg-freq", "batch", "cluster", "context", "hint", "kill-on-invalid-dep", "ntasks-per-gpu", "ntasks-per-tres",
        "open-mode", "prefer", "tasks-per-node", "test-only", "wait-all-nodes",
    },
    "25.11": {
        "acctg-freq", "autocomplete", "batch", "cluster", "consolidate-segments", "context", "external", "extra", "hint",
        "kill-on-invalid-dep", "ntasks-per-gpu", "ntasks-per-tres", "open-mode", "prefer", "resources", "segment",
        "stepmgr", "tasks-per-node", "test-only", "wait-all-nodes",
    },
}  # fmt: skip
# the help names these, and sbatch refuses them: "unrecognized option '--power=x'" (removed in 24.05)
HELP_BUT_REFUSED = {"22.05": set(), "25.11": {"power"}}

# "  -a, --array=indexes", "      --exclusive[=user]", "  -B  --extra-node-info=S[:C[:T]]"
HELP_LINE_RE = re.compile(r"^\s+(?:-(?P<letter>\w),?\s+)?--(?P<name>[a-z][a-z0-9-]*)(?P<value>\[?=)?")


@pytest.fixture(params=["22.05", "25.11"])
def sbatch_help(request, settings):
    """(release, --help, --usage) of that cluster's sbatch; the cluster must run a release the table has."""
    use_slurm_target(settings, "cli", request.param)
    version = slurm_command("sbatch", "--version").stdout.split()[-1]
    release = release_of(version)
    assert release == request.param, f"the {request.param} cluster runs Slurm {version}: regenerate the table (sbatch/generate_options.py)"
    return release, slurm_command("sbatch", "--help").stdout, slurm_command("sbatch", "--usage").stdout


def test_every_option_the_help_names_is_in_the_table_of_that_release_with_its_letter(sbatch_help):
    release, help_text, _usage = sbatch_help
    table = option_table(release)
    named = [m.groupdict() for m in map(HELP_LINE_RE.match, help_text.splitlines()) if m]
    assert len(named) >= 90
    assert {d["name"] for d in named} - set(table.has_arg) == HELP_BUT_REFUSED[release]
    for d in named:
        if d["name"] in HELP_BUT_REFUSED[release]:
            continue
        if d["letter"]:
            assert table.short[d["letter"]] == d["name"], d
        if d["value"]:  # --x=value or --x[=value]: the table takes a value (--wrap[=...] is required in fact)
            assert table.has_arg[d["name"]] != NONE, d
    letters = {d["letter"] for d in named if d["letter"]}
    assert letters <= set(table.short) and len(letters) >= 30


def test_the_options_the_help_and_usage_do_not_name_are_the_known_undocumented_ones(sbatch_help):
    release, help_text, usage = sbatch_help
    documented = set(re.findall(r"(?<![\w-])--([a-z][a-z0-9-]*)", help_text + usage))
    table = set(option_table(release).has_arg)
    assert documented - table == HELP_BUT_REFUSED[release]
    assert table - documented == UNDOCUMENTED[release]


def test_what_the_help_names_and_the_table_has_not_sbatch_refuses(sbatch_help):
    release, _help, _usage = sbatch_help
    for name in HELP_BUT_REFUSED[release] | {"surely-no-such-option"}:
        result = slurm_command("sbatch", f"--{name}=x", "--test-only", "--wrap", "true", check=False)
        assert result.returncode != 0 and f"unrecognized option '--{name}=x'" in result.stderr, (name, result.stderr)
