"""Pages a researcher checks many times a day, in Chromium: an array job's task table follows a real
4-task array on the local cluster without a reload; every page of the URL matrix fits a phone
(390 px) and a desktop (1366 px) screen for each role (no horizontal page scroll:
``document.documentElement.scrollWidth <= innerWidth``), the menu collapsing behind its button.

Kept cheap: one browser, one context per role, one tab reused for every page and both widths."""

from __future__ import annotations

import pytest

from jobs.choices import JobState
from tests.browser.helpers import log_in, screenshot
from tests.conftest import ROLES

pytestmark = [pytest.mark.browser]

expect = pytest.importorskip("playwright.sync_api").expect

WIDTHS = (390, 1366)
ARRAY_DONE_TIMEOUT_MS = 120_000  # relay + 4 tasks of a few seconds, two at a time, + sync; the cluster is shared

ARRAY_SCRIPT = """#!/bin/bash
#SBATCH --array=0-3%2
echo "task $SLURM_ARRAY_TASK_ID of job $SLURM_ARRAY_JOB_ID"
sleep 4
echo "task $SLURM_ARRAY_TASK_ID done" >&2
"""


@pytest.mark.slurm
@pytest.mark.celery
def test_an_array_jobs_task_table_follows_its_four_tasks_without_a_reload(portal, browsing):
    from jobs.services import job_submit

    job, _ = job_submit(
        user=portal.alice, team=portal.vision, name="browser-array", script=ARRAY_SCRIPT, partition="gpu", gpus=1, time_limit_minutes=5,
    )  # fmt: skip
    assert job.array_tasks == 4
    page = browsing.page()
    log_in(page, "alice")
    page.goto(f"/jobs/{job.pk}/")
    page.evaluate("window.__notReloaded = true")
    table = page.locator("#job-array-tasks")
    expect(table.locator("tr[data-task]")).to_have_count(4)
    # while it runs, tasks are still pending or running (two at a time: %2) ...
    expect(table.locator('tr[data-state="RUNNING"]').first).to_be_visible(timeout=ARRAY_DONE_TIMEOUT_MS)
    seen_live = table.locator(".task-counts").inner_text()
    screenshot(page, "job-array-running")
    # ... and the same page, never reloaded, ends with every task completed, Slurm's own ids, exit codes
    expect(table.locator('tr[data-state="COMPLETED"]')).to_have_count(4, timeout=ARRAY_DONE_TIMEOUT_MS)
    expect(page.locator("#job-status")).to_contain_text("Completed")
    assert page.evaluate("window.__notReloaded") is True
    assert "running" in seen_live and table.locator(".task-counts").inner_text().strip().endswith("4 completed")
    job.refresh_from_db()
    assert job.state == JobState.COMPLETED
    for index in range(4):
        row = table.locator(f'tr[data-task="{index}"]')
        expect(row).to_contain_text(f"{job.slurm_job_id}_{index}")
        expect(row.locator("td").nth(5)).to_have_text("0")
    # every task's output is one click away (htmx swaps the output box)
    table.locator('tr[data-task="3"]').get_by_role("link", name="stderr").click()
    expect(page.locator("#job-output")).to_contain_text("task 3 done")
    table.locator('tr[data-task="2"]').get_by_role("link", name="stdout").click()
    expect(page.locator("#job-output")).to_contain_text(f"task 2 of job {job.slurm_job_id}")
    assert page.evaluate("window.__notReloaded") is True
    screenshot(page, "job-array-completed")
    browsing.assert_clean()


def _matrix_pages(objects) -> list[tuple[str, tuple]]:
    """The pages of the URL matrix (GET, HTML, whole pages: no API, partials, downloads or probes)."""
    from tests.security.test_url_matrix import MATRIX

    skip_names = {"cluster-partial", "jobs:live-states", "jobs:quote", "jobs:output", "healthz", "livez", "metrics", "api-schema", "api-docs",
                  "oidc_authentication_init", "oidc_authentication_callback", "accounting:invoice-pdf", "accounting:invoice-jobs-csv",
                  "logout"}  # fmt: skip
    pages = []
    for name, requests in MATRIX.items():
        if name in skip_names or name.startswith("api-"):
            continue
        for req in requests:
            if req.method == "GET":
                pages.append((req.path(objects), req.expected))
    return pages


@pytest.mark.django_db(transaction=True)
def test_every_page_fits_a_phone_and_a_desktop_screen_for_every_role(world, chromium, live_server):
    from tests.security.test_url_matrix import Objects

    pages = _matrix_pages(Objects(world))
    assert len(pages) >= 15
    too_wide = []
    checked = 0
    for role in ROLES:
        context = chromium.new_context(base_url=live_server.url, viewport={"width": WIDTHS[1], "height": 800}, locale="en-GB",
                                       timezone_id="UTC")  # fmt: skip
        try:
            page = context.new_page()
            user = world.user_for(role)
            if user is not None:
                log_in(page, user.username)  # at desktop width: the menu (and "Log out") open
            for width in WIDTHS:
                page.set_viewport_size({"width": width, "height": 800})
                for path, expected in pages:
                    status = expected[ROLES.index(role)]
                    if status not in (200, 403, 404) and not (status == 302 and role == "anonymous"):
                        continue  # a redirect to a page checked anyway
                    page.goto(path, wait_until="domcontentloaded")  # after the stylesheet (the deferred scripts wait for it)
                    scroll, inner = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
                    checked += 1
                    if scroll > inner:
                        too_wide.append(f"{role} {width}px {path}: {scroll} px wide")
            if user is not None and role == "member":  # the menu collapses behind its button on a phone
                page.set_viewport_size({"width": WIDTHS[0], "height": 800})
                page.goto("/")
                menu = page.get_by_role("button", name="Menu")
                expect(menu).to_be_visible()
                expect(page.get_by_role("navigation", name="Main")).to_be_hidden()
                menu.click()
                expect(page.get_by_role("link", name="Jobs", exact=True)).to_be_visible()
                page.set_viewport_size({"width": WIDTHS[1], "height": 800})
                expect(page.get_by_role("button", name="Menu")).to_be_hidden()
        finally:
            context.close()
    assert checked > len(pages) * 2
    assert not too_wide, "\n".join(too_wide)
