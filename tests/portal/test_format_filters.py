"""portal_format's filters that turn a scheduler's figures into what a page shows."""

from __future__ import annotations

from django.template import Context, Template


def test_signal_names_the_signal_that_ended_a_job():
    from portal.templatetags.portal_format import signal

    assert signal(9) == "signal 9 (SIGKILL)"
    assert signal(15) == "signal 15 (SIGTERM)"
    # slurmd's ESLURMD_IO_ERROR (4021) as sacct shows it, 0:53: not a signal anyone sent
    assert signal(53).startswith("signal 53: Slurm could not open the job's output or error file")
    assert signal(40) == "signal 40"  # a real-time signal Python does not name
    assert signal(0) == "" and signal(None) == ""
    rendered = Template("{% load portal_format %}{{ n|signal }}").render(Context({"n": 6}))
    assert rendered == "signal 6 (SIGABRT)"
