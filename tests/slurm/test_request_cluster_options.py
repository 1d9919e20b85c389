"""portal.slurm.request: a gateway talks to its own cluster, so the options that choose one (a
script's ``-M``/``--clusters``/``--cluster``, which jobs.spec reads as the job's cluster) never reach
sbatch or pyslurm: a line holding only them becomes a comment, a line holding others too keeps those
(read back by the one parser as sbatch reads them), and the line numbers stay. The last test runs
real sbatch on each local cluster; the portal's path to the non-default cluster:
tests/jobs/test_spec_clusters.py."""

from __future__ import annotations

import uuid

import pytest

from gpuportal_sbatch.directives import CLUSTER_OPTIONS, parse_directives
from portal.slurm import get_gateway
from portal.slurm.cli_argv import sbatch_argv
from portal.slurm.pyslurm_request import description_kwargs
from portal.slurm.types import JobSubmission, SlurmRejected
from tests.support import slurm_job

WRITTEN: dict = {}  # request -> the script as written


def _spec(*lines: str, options: tuple = (("partition", "gpu"),)) -> JobSubmission:
    script = "#!/bin/bash\n" + "".join(f"{line}\n" for line in lines) + "srun true\n"
    submission = slurm_job(script, account="vision", partition="gpu", options=list(options))
    WRITTEN[submission.request] = script
    return submission


def spec_script(spec: JobSubmission) -> str:
    return spec.request.script


def spec_request(spec: JobSubmission) -> list:
    return spec.options


def spec_options(spec: JobSubmission) -> list:
    return spec.command_line


def _kept(spec: JobSubmission) -> list[tuple[str, str | None, int]]:
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
    assert len(script.splitlines()) == len(WRITTEN[spec.request].splitlines())  # line numbers stay


def test_a_value_on_the_next_line_goes_with_its_option_and_other_lines_keep_their_options():
    spec = _spec("#SBATCH -M", "#SBATCH east -t 5", "#SBATCH --nodes 1", "#SBATCH -J", "#SBATCH 'a b' --clusters", "#SBATCH east")
    script = spec_script(spec)
    assert _kept(spec) == [("time", "5", 3), ("nodes", "1", 4), ("job-name", "a b", 5)]
    assert script.splitlines()[1] == "# [gpuportal: replaced] SBATCH -M"
    assert script.splitlines()[6] == "# [gpuportal: replaced] SBATCH east"
    assert len(script.splitlines()) == len(WRITTEN[spec.request].splitlines())


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
    assert spec_script(spec) == WRITTEN[spec.request]


# ---------------------------------------------------------------- real sbatch


@pytest.mark.slurm
def test_a_cluster_name_slurmdbd_does_not_know_still_submits_to_the_gateways_own_cluster(slurm_target, settings):
    """A portal cluster name need not be Slurm's ClusterName: sbatch given ``-M`` that name asks its
    slurmdbd and refuses (measured on 22.05 and 25.11: "No cluster 'x' known by database"); the
    gateway takes the directive out (alone on its line and beside others), so the job is submitted
    to the cluster of the gateway's SLURM_CONF."""
    real = get_gateway()
    gateway = type(real)(cluster="site-x", timeout=settings.SLURM_TIMEOUT, slurm_conf=settings.SLURM_CONF,
                         bin_dir=settings.SLURM_BIN_DIR)  # fmt: skip
    tag = f"gpuportal-test:{uuid.uuid4()}"
    script = "#!/bin/bash\n#SBATCH -M site-x\n#SBATCH -t 1 --clusters=site-x -J m-test --clusters\n#SBATCH site-x\ntrue\n"
    with pytest.raises(SlurmRejected, match="known by database"):  # what sbatch does with the directive
        cli = getattr(real, "_cli", real)  # the pyslurm gateway's cli backend runs sbatch
        cli._run([cli._exe("sbatch"), "--parsable", "--hold", "-A", "root", "-p", "gpu"], stdin=script)
    spec = slurm_job(script, account="root", partition="gpu", comment=tag, options=[("partition", "gpu"), ("hold", None)])
    job_id = gateway.submit(spec)
    try:
        assert real.find_by_comment(tag) == job_id
        (entry,) = [e for e in real.queue() if e.job_id == job_id]
        assert (entry.name, entry.time_limit_minutes) == ("m-test", 1)  # the line's other options reached Slurm
    finally:
        real.cancel(job_id)
