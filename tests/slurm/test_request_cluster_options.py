"""portal.slurm.request: a gateway talks to its own cluster, so the options that choose one (a
script's ``-M``/``--clusters``/``--cluster``, which jobs.spec reads as the job's cluster) never reach
sbatch or pyslurm: a line holding only them becomes a comment, a line holding others too keeps those
(read back by the one parser as sbatch reads them), and the line numbers stay. Pure; real sbatch on
the non-default cluster: tests/jobs/test_spec_clusters.py."""

from __future__ import annotations

import pytest

from gpuportal_cli.sbatch_directives import CLUSTER_OPTIONS, parse_directives
from portal.slurm.cli_argv import sbatch_argv
from portal.slurm.pyslurm_request import description_kwargs
from portal.slurm.request import spec_options, spec_request, spec_script
from portal.slurm.types import JobSpec


def _spec(*lines: str, options: tuple = (("partition", "gpu"),)) -> JobSpec:
    script = "#!/bin/bash\n" + "".join(f"{line}\n" for line in lines) + "srun true\n"
    return JobSpec(script=script, account="vision", partition="gpu", options=options)


def _kept(spec: JobSpec) -> list[tuple[str, str | None, int]]:
    return [(d.option, d.value, d.line) for d in parse_directives(spec_script(spec))]


@pytest.mark.parametrize("directive", ["-M east", "--clusters=east", "--clusters east", "--cluster=east", "-Meast"])
def test_a_line_of_only_a_cluster_option_becomes_a_comment(directive):
    spec = _spec("#SBATCH --gres=gpu:1", f"#SBATCH {directive}", "#SBATCH -t 5")
    script = spec_script(spec)
    assert script.splitlines()[2] == f"# [gpuportal: replaced] SBATCH {directive}"
    assert _kept(spec) == [("gres", "gpu:1", 2), ("time", "5", 4)]
    assert [option for option, _ in spec_request(spec)] == ["gres", "time", "partition", "account"]


def test_a_line_with_other_options_keeps_them_quoted_as_sbatch_reads_them():
    spec = _spec("#SBATCH --gres=gpu:1 -M east -J 'two words' --comment=\"it's #1\" --exclusive", "#SBATCH -t 5")
    script = spec_script(spec)
    line = script.splitlines()[1]
    assert line.startswith("#SBATCH ") and "[gpuportal: cluster option taken out]" in line
    assert _kept(spec) == [
        ("gres", "gpu:1", 2), ("job-name", "two words", 2), ("comment", "it's #1", 2), ("exclusive", None, 2), ("time", "5", 3),
    ]  # fmt: skip
    assert len(script.splitlines()) == len(spec.script.splitlines())  # line numbers stay


def test_a_portal_option_that_replaces_a_directive_on_that_line_still_wins():
    spec = _spec("#SBATCH -M east -t 30", options=(("partition", "gpu"), ("time", "5")))
    # the line's only other directive is replaced by the command line: the whole line is a comment
    assert _kept(spec) == []
    assert dict(spec_request(spec))["time"] == "5"


def test_cluster_options_are_never_on_the_command_line_nor_in_pyslurms_request():
    spec = _spec("#SBATCH --clusters=east", "#SBATCH --gres=gpu:1", options=(("partition", "gpu"), ("clusters", "east")))
    assert not any(option in CLUSTER_OPTIONS for option, _ in spec_options(spec))
    assert not any(arg.startswith(("--clusters", "--cluster", "-M")) for arg in sbatch_argv(spec))
    kwargs = description_kwargs(spec)  # pyslurm submits it itself: no fall-back to the cli backend
    assert kwargs["gres_per_node"] == "gpu:1" and kwargs["partitions"] == "gpu"


def test_a_script_without_cluster_options_is_sent_as_before():
    spec = _spec("#SBATCH --gres=gpu:1 -t 5")
    assert spec_script(spec) == spec.script
