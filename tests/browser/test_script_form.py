"""The submission form read from an uploaded script in a real browser (Debian's Chromium through
Playwright; htmx reads the file on the server): the fields fill from its #SBATCH lines, the
directive table shows what each became, a changed time limit is the job's only override."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from jobs.models import Job
from jobs.spec import validate_job_spec
from tests.browser.helpers import log_in, screenshot

from tests.support import job_overrides

pytestmark = [pytest.mark.browser, pytest.mark.slurm, pytest.mark.celery]

expect = pytest.importorskip("playwright.sync_api").expect

SCRIPT = Path(__file__).parent.parent / "jobs" / "sbatch_corpus" / "01-ddp-gres-cpus-per-task.sbatch"


def test_member_uploads_a_script_sees_the_fields_filled_changes_the_time_and_submits(portal, browsing, world):
    page = browsing.page()
    log_in(page, "alice")
    page.goto(browsing.base_url + "/jobs/new/")
    expect(page.get_by_role("heading", name="Submit a job")).to_be_visible()

    page.get_by_label("Script file:", exact=True).set_input_files(str(SCRIPT))
    # htmx posts the file to the server, which reads it and fills the form
    expect(page.get_by_label("GPUs:", exact=True)).to_have_value("2")
    expect(page.get_by_label("GPU type:", exact=True)).to_have_value("a100")
    expect(page.get_by_label("CPUs per task:", exact=True)).to_have_value("4")
    expect(page.get_by_label("Time limit:", exact=True)).to_have_value("0:05:00")
    expect(page.get_by_label("Nodes:", exact=True)).to_have_value("")
    expect(page.get_by_label("Script:", exact=True)).to_have_value(SCRIPT.read_text())
    table = page.locator("table.directives")
    expect(table).to_contain_text("--gres=gpu:a100:2")
    expect(table).to_contain_text("time limit 5 min")
    expect(page.locator("#job-quote .stat")).to_be_visible()  # the estimate follows the filled fields
    expect(page.get_by_role("status")).to_contain_text("Read from the script")
    screenshot(page, "job-form-read-script")

    page.get_by_label("Time limit:", exact=True).fill("0:10:00")
    page.get_by_role("button", name="Submit job").click()
    expect(page.get_by_role("status")).to_contain_text("accepted")
    job_id = re.search(r"/jobs/([0-9a-f-]{36})/$", page.url).group(1)
    job = Job.objects.get(pk=uuid.UUID(job_id))
    import pwd

    assert job.workdir == pwd.getpwnam("alice").pw_dir  # the submitter's own default directory (JOB_DEFAULT_WORKDIR)
    alone = validate_job_spec(
        script=SCRIPT.read_text(), name=None, partition="", gpu_type="", gpus=None, nodes=None, cpus_per_gpu=None,
        memory_gb=None, time_limit_minutes=None, workdir=job.workdir, environment={}, account=world.vision.slurm_account,
    )  # fmt: skip
    # the only override the user made is the time; the rest is what the portal adds to any script
    assert sorted(job_overrides(job)) == sorted(job_overrides(alone) + [["time", "10"]])
    assert (job.gpus, job.gpu_type, job.time_limit_minutes, job.script) == (2, "a100", 10, SCRIPT.read_text())
    browsing.assert_clean()


def test_read_script_works_without_javascript(portal, browsing):
    page = browsing.page(javascript=False)
    log_in(page, "alice")
    page.goto(browsing.base_url + "/jobs/new/")
    page.get_by_label("Script:", exact=True).fill(SCRIPT.read_text())
    page.get_by_role("button", name="Read script").click()
    expect(page.get_by_label("GPUs:", exact=True)).to_have_value("2")
    expect(page.get_by_label("CPUs per task:", exact=True)).to_have_value("4")
    expect(page.get_by_label("Time limit:", exact=True)).to_have_value("0:05:00")
    expect(page.locator("table.directives")).to_contain_text("--cpus-per-task=4")
    assert Job.objects.count() == 0  # reading is not submitting
    browsing.assert_clean()


def test_pasting_a_script_fills_the_fields(portal, browsing):
    page = browsing.page()
    log_in(page, "alice")
    page.goto(browsing.base_url + "/jobs/new/")
    script = page.get_by_label("Script:", exact=True)
    script.fill(SCRIPT.read_text())
    script.dispatch_event("paste")  # what the browser fires after the text lands (htmx reads on paste)
    expect(page.get_by_label("GPUs:", exact=True)).to_have_value("2")
    expect(page.get_by_label("Time limit:", exact=True)).to_have_value("0:05:00")
    expect(page.locator("table.directives")).to_contain_text("--gres=gpu:a100:2")
    browsing.assert_clean()
