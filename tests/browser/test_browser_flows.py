"""The portal in a real browser (Debian's Chromium through Playwright): log in through the form,
submit a job and watch the htmx estimate, watch it reach COMPLETED without reloading, read its
output, cancel a sleeping job from its page, download the cost report's CSV, the core pages without
JavaScript, book a whole GPU node on the bookings calendar and cancel it; a screenshot of each main
page under test-artifacts/screenshots/.

Against the live server, the real Celery worker, the local Slurm cluster and a sync loop standing in
for beat (tests/browser/conftest.py)."""

from __future__ import annotations

import csv
import io
import re
import time
from pathlib import Path

import pytest

from jobs.choices import JobState
from jobs.models import Job
from tests.browser.helpers import log_in, screenshot
from tests.support import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.slurm, pytest.mark.celery]

expect = pytest.importorskip("playwright.sync_api").expect

COMPLETED_TIMEOUT_MS = 90_000  # relay + Slurm start + sync; the shared cluster may be busy
RUNNING_TIMEOUT_MS = 60_000
CANCELLED_TIMEOUT_MS = 45_000

GPU_SCRIPT = """#!/bin/bash
echo "hello from the browser test"
echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
"""



def _estimate(gpus: int, minutes: int):
    """The form's estimate as the page shows it: GPU-seconds with the partition's overrun past the time
    limit (read from the cluster: KillWait, OverTimeLimit), at 8 CNY/GPU-h, rounded up to six places,
    shown to two (jobs.estimate)."""
    from types import SimpleNamespace
    from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal

    from jobs.inventory import partition_capacity

    overrun = partition_capacity("gpu").overrun_seconds or 0
    hours = (Decimal(gpus * (minutes * 60 + overrun)) / 3600).quantize(Decimal("0.000001"), ROUND_CEILING)
    cost = (hours * 8).quantize(Decimal("0.000001"), ROUND_CEILING)
    two = Decimal("0.01")
    return SimpleNamespace(cost=f"{cost.quantize(two, ROUND_HALF_UP)}", gpu_hours=f"{hours.quantize(two, ROUND_HALF_UP)}")

def _badge(page, job_id):
    return page.locator(f"#state-{job_id}")


def test_member_logs_in_submits_a_job_watches_it_complete_and_reads_its_output(portal, browsing):
    page = browsing.page()
    log_in(page, "alice")
    expect(page.get_by_role("heading", name="Cluster")).to_be_visible()
    expect(page.locator("#cluster-summary")).to_contain_text("A100 GPUs")
    screenshot(page, "dashboard")

    page.get_by_role("link", name="Jobs", exact=True).click()
    page.get_by_role("link", name="Submit a job").first.click()
    expect(page.get_by_role("heading", name="Submit a job")).to_be_visible()
    page.get_by_label("Name:", exact=True).fill("browser-hello")
    # any GPU type: the shared cluster may have no a100 free; the estimate takes the dearest priced type (a100)
    expect(page.get_by_label("GPU type:", exact=True)).to_have_value("")
    page.get_by_label("Time limit:", exact=True).fill("15")
    page.get_by_label("Script:", exact=True).fill(GPU_SCRIPT)

    # the estimate follows the form (htmx posts the form to the quote view on change / keyup)
    gpus = page.get_by_label("GPUs:", exact=True)
    gpus.fill("1")
    gpus.press("Tab")
    quote = page.locator("#job-quote")
    one, two = _estimate(1, 15), _estimate(2, 15)  # 1 GPU × (15 min + the cluster's overrun) × 8 CNY/GPU-h
    expect(quote.locator(".stat")).to_contain_text(one.cost)
    expect(quote).to_contain_text(f"at most {one.gpu_hours} GPU-hours")
    gpus.select_text()
    gpus.press_sequentially("2")  # typing: the keyup trigger (debounced), no blur needed
    expect(quote.locator(".stat")).to_contain_text(two.cost)
    expect(quote).to_contain_text(f"at most {two.gpu_hours} GPU-hours")
    gpus.select_text()
    gpus.press_sequentially("1")
    expect(quote.locator(".stat")).to_contain_text(one.cost)
    screenshot(page, "job-form")

    # Leave the field first, as a person moving to the button does: the blur's "change" refreshes the
    # estimate, and a click racing that swap can land beside the moved button (mousedown on the
    # button, mouseup on another element: no click, no submit).
    gpus.press("Tab")
    expect(page.locator("form.htmx-request")).to_have_count(0)
    expect(quote.locator(".stat")).to_contain_text(one.cost)
    page.get_by_role("button", name="Submit job").click()
    expect(page.get_by_role("status")).to_contain_text("Job browser-hello accepted")
    job = Job.objects.get(name="browser-hello")
    assert re.search(rf"/jobs/{job.pk}/$", page.url)
    assert (job.submitter.username, job.gpus, job.gpu_type, job.time_limit_minutes) == ("alice", 1, "", 15)

    # no reload: the detail page polls; a flag on window would not survive a navigation
    page.evaluate("window.__notReloaded = true")
    expect(_badge(page, job.pk)).to_have_text("Completed", timeout=COMPLETED_TIMEOUT_MS)
    expect(page.locator("#job-status")).to_contain_text(
        f"Slurm job {Job.objects.get(pk=job.pk).slurm_job_id}"
    )
    expect(page.locator("#job-status")).to_contain_text("exit code 0")
    output = page.locator("#job-output pre.output")
    expect(output).to_contain_text("hello from the browser test", timeout=15_000)
    expect(output).to_contain_text(re.compile(r"CUDA_VISIBLE_DEVICES=\d"))
    assert page.evaluate("window.__notReloaded") is True
    # the cancel button went with the last poll of the status card
    expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)
    screenshot(page, "job-detail")

    page.get_by_role("link", name="← Jobs").click()
    row = page.get_by_role("row").filter(has=page.get_by_role("link", name="browser-hello"))
    expect(row).to_contain_text("Completed")
    expect(row).to_contain_text(f"{one.cost} CNY")
    screenshot(page, "job-list")
    browsing.assert_clean()


@pytest.fixture
def scancel_leftovers():
    """Slurm ids to cancel after the test whatever happened: the cluster is shared."""
    from portal.slurm import SlurmError, get_gateway

    ids: list[int] = []
    yield ids
    for slurm_id in ids:
        try:
            get_gateway().cancel(slurm_id)
        except SlurmError:
            pass


def _status_swap_watch(page) -> None:
    """Count the status cards a poll puts in place from now on (``window.__statusSwaps``): htmx fires
    ``htmx:load`` on the new card once it is swapped in and settled, after the page's own listeners."""
    page.evaluate("""() => {
        window.__statusSwaps = 0;
        document.addEventListener("htmx:load", (e) => {
            if (e.target.id === "job-status") window.__statusSwaps += 1;
        });
    }""")


def test_member_cancels_a_sleeping_job_from_its_page(portal, browsing, scancel_leftovers):
    from jobs.services import job_submit

    job, _ = job_submit(
        user=portal.alice, team=portal.vision, name="browser-sleeper", script="#!/bin/bash\nsleep 600\n",
        partition="gpu", gpus=1, time_limit_minutes=15,
    )  # fmt: skip
    page = browsing.page()
    log_in(page, "alice")
    page.goto(f"/jobs/{job.pk}/")
    page.evaluate("window.__notReloaded = true")
    expect(_badge(page, job.pk)).to_have_text("Running", timeout=RUNNING_TIMEOUT_MS)
    assert page.evaluate("window.__notReloaded") is True
    job.refresh_from_db()
    scancel_leftovers.append(job.slurm_job_id)
    screenshot(page, "job-detail-running")

    # the reader opened the state history: the next poll of the status card keeps it open
    page.get_by_text("State history").click()
    expect(page.locator("#job-status details")).to_have_attribute("open", "")
    _status_swap_watch(page)
    # the next poll's card is in place (htmx:load); polled from here: the page's CSP (no 'unsafe-eval')
    # refuses wait_for_function's in-page string predicate
    deadline = time.monotonic() + 30
    while not page.evaluate("window.__statusSwaps > 0"):
        assert time.monotonic() < deadline, "no poll of the status card within 30 s"
        page.wait_for_timeout(200)
    expect(page.locator("#job-status details")).to_have_attribute("open", "")
    expect(page.locator("#job-status details").get_by_role("row").filter(has_text="Running")).to_be_visible()

    dialogs = []  # the page asks first (site.js, data-confirm); the reader says yes
    page.once("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.accept()))
    page.get_by_role("button", name="Cancel job").click()
    expect(page.get_by_role("status")).to_contain_text(re.compile("Cancellation requested|Job cancelled"))
    expect(_badge(page, job.pk)).to_have_text("Cancelled", timeout=CANCELLED_TIMEOUT_MS)
    expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and job.cancel_requested
    assert dialogs and dialogs[0].startswith(f"Cancel job {job.name}")
    browsing.assert_clean()


REPORT_MONTH = ("2026-01-01", "2026-01-31")


@pytest.fixture
def usage(cluster, a100_rate, settings):
    """Hand-made accounting records of January 2026, priced at the a100 rate (8 CNY per GPU-hour)."""
    from accounting.services import usage_records_upsert
    from tests.accounting.helpers import acct, at

    settings.TIME_ZONE = "UTC"  # billing months and days
    usage_records_upsert(records=[
        acct(account="vision", user="alice", start=at(2026, 1, 5, 10), hours=2, gpus=2),  # 4 GPU-h: 32
        acct(account="nlp", user="carol", start=at(2026, 1, 8, 10), hours=1, gpus=1),  # 1 GPU-h: 8
    ])  # fmt: skip


@pytest.mark.parametrize("username", ["finn", "admin"])
def test_finance_and_admin_read_the_cost_report_and_download_its_csv(usage, browsing, username):
    page = browsing.page()
    log_in(page, username)
    page.get_by_role("link", name="Reports").click()
    expect(page.get_by_role("heading", name="Cost reports")).to_be_visible()
    page.get_by_label("From").fill(REPORT_MONTH[0])
    page.get_by_label("To", exact=True).fill(REPORT_MONTH[1])
    page.get_by_role("button", name="Show").click()
    expect(page.get_by_text("Range Jan. 1, 2026 – Jan. 31, 2026")).to_be_visible()
    by_team = page.get_by_role("table").filter(has=page.get_by_role("columnheader", name="Team"))
    expect(by_team.get_by_role("row").filter(has_text="Vision")).to_contain_text("32.00")
    expect(by_team.get_by_role("row").filter(has_text="NLP")).to_contain_text("8.00")
    expect(page.locator("#chart-usage")).to_be_visible()
    if username == "finn":
        screenshot(page, "reports")

    with page.expect_download() as download_info:
        page.get_by_role("link", name="by team").click()
    download = download_info.value
    assert download.suggested_filename == "cost-team-2026-01-01-2026-01-31.csv"
    rows = list(csv.DictReader(io.StringIO(Path(download.path()).read_text(encoding="utf-8-sig"))))
    assert list(rows[0]) == ["group_by", "key", "label", "gpu_hours", "requested_gpu_hours", "efficiency", "cost",
                             "unpriced_gpu_hours", "currency",
                             "monitored_gpu_hours", "busy_gpu_hours", "gpu_efficiency", "idle_cost"]  # fmt: skip
    by_label = {row["label"]: row for row in rows}
    assert set(by_label) == {"Vision", "NLP"}
    assert {k: by_label["Vision"][k] for k in ("group_by", "gpu_hours", "cost", "currency")} == {
        "group_by": "team", "gpu_hours": "4.00", "cost": "32.00", "currency": "CNY"}  # fmt: skip
    assert by_label["NLP"]["cost"] == "8.00"
    browsing.assert_clean()


def test_member_sets_her_profile_and_creates_an_api_token(world, browsing):
    page = browsing.page()
    log_in(page, "alice")
    page.get_by_role("link", name="alice").click()
    expect(page.get_by_role("heading", name="Your profile")).to_be_visible()
    page.get_by_label("Time zone").fill("Asia/Shanghai")
    page.get_by_label("Email me when my jobs end").check()
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_text("Profile saved.")).to_be_visible()
    from portal.models import Profile

    assert Profile.objects.filter(user=world.alice, time_zone="Asia/Shanghai", notify_job_end=True).exists()
    screenshot(page, "profile")
    page.get_by_role("link", name="manage them here").click()
    expect(page.get_by_role("heading", name="API tokens")).to_be_visible()
    page.get_by_label("New token name").fill("laptop")
    page.get_by_role("button", name="Create token").click()
    expect(page.locator("#new-token")).to_have_text(re.compile(r"^gpp_\S{20,}$"))
    expect(page.get_by_role("row").filter(has_text="laptop")).to_contain_text("active")
    screenshot(page, "tokens")
    browsing.assert_clean()


@pytest.mark.parametrize("username", ["alice", "admin"])
def test_every_main_menu_link_opens_a_page(world, browsing, username):
    page = browsing.page()
    log_in(page, username)
    links = page.get_by_role("navigation", name="Main").get_by_role("link")
    hrefs = [links.nth(i).get_attribute("href") for i in range(links.count())]
    assert {"/", "/jobs/", "/teams/"} <= set(hrefs)
    assert ("/accounting/reports/" in hrefs) == (username == "admin")
    broken = {href: status for href in hrefs if (status := page.request.get(href).status) != 200}
    assert not broken, f"main menu links that do not open a page: {broken}"


def test_core_pages_work_without_javascript(portal, browsing):
    """Log in, submit a job with the plain form, see it in the list and on its page: no htmx."""
    page = browsing.page(javascript=False)
    log_in(page, "alice")
    expect(page.get_by_role("heading", name="Cluster")).to_be_visible()
    page.get_by_role("link", name="Jobs", exact=True).click()
    expect(page.get_by_role("heading", name="Jobs")).to_be_visible()
    page.get_by_role("link", name="Submit a job").first.click()
    page.get_by_label("Name:", exact=True).fill("no-js")
    page.get_by_label("GPUs:", exact=True).fill("1")
    page.get_by_label("Time limit:", exact=True).fill("5")
    page.get_by_label("Script:", exact=True).fill(GPU_SCRIPT)
    expect(page.locator("#job-quote")).to_contain_text(
        "to see an estimate"
    )  # rendered on the server: without JavaScript the estimate shows after a submit (or the noscript button)
    page.get_by_role("button", name="Submit job").click()
    expect(page.get_by_role("status")).to_contain_text("Job no-js accepted")
    job = Job.objects.get(name="no-js")
    expect(_badge(page, job.pk)).to_be_visible()
    expect(page.get_by_role("heading", name="no-js")).to_be_visible()
    expect(page.get_by_role("link", name="reload")).to_be_visible()  # how to see news without the poll

    page.get_by_role("link", name="← Jobs").click()
    expect(page.get_by_role("link", name="no-js")).to_be_visible()
    page.get_by_role("link", name="no-js").click()
    expect(page.get_by_role("heading", name="Script")).to_be_visible()
    expect(page.locator("#job-output")).to_be_visible()
    browsing.assert_clean()


BOOKING_RESERVED_TIMEOUT_S = 60  # the real worker makes the Slurm reservation after commit


@pytest.fixture
def booking_leftovers():
    """Reservations of bookings the test made: deleted afterwards whatever happened (the cluster is
    shared); any booking of the test still approved is cancelled first so the sweeper leaves it be."""
    from accounting.models import Booking, BookingStatus, ReservationState
    from portal.slurm import SlurmError, get_gateway

    yield
    names = list(Booking.objects.values_list("reservation_name", flat=True))
    Booking.objects.filter(status__in=[BookingStatus.APPROVED, BookingStatus.REQUESTED]).update(
        status=BookingStatus.CANCELLED, reservation_state=ReservationState.DELETED
    )
    for name in names:
        try:
            get_gateway().reservation_delete(name)
        except SlurmError:
            pass


def _booking_row(page, booking):
    return page.locator(f'#booking-table tr[data-booking="{booking.pk}"]')


def _wait_for_reservation(booking, state) -> None:
    """Wait until the worker has left ``booking``'s reservation in ``state`` or failed it (then say why)."""
    from accounting.models import ReservationState

    def settled():
        booking.refresh_from_db()
        return booking.reservation_state in (state, ReservationState.FAILED)

    wait_for(settled, timeout=BOOKING_RESERVED_TIMEOUT_S, interval=0.5, what=f"reservation {state.label!r}")
    assert booking.reservation_state == state, booking.reservation_error


def test_manager_books_gpus_on_the_calendar_and_cancels(portal, browsing, booking_leftovers, settings):
    """bob books a whole a100 node (4 GPUs × 30 min = 2 GPU-h: approved at once) a few minutes from
    now, sees the reservation made in Slurm by the real worker, cancels it, and it is gone."""
    import datetime as dt

    from django.utils import timezone

    from accounting.models import Booking, BookingStatus, ReservationState
    from portal.slurm import get_gateway

    settings.TIME_ZONE = "UTC"  # the browser's time zone too (tests/browser/conftest.py)
    page = browsing.page()
    log_in(page, "bob")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Bookings").click()
    expect(page.get_by_role("heading", name="GPU bookings")).to_be_visible()
    calendar = page.locator("#booking-calendar")
    expect(calendar.locator('table[data-gpu-type="a100"]')).to_be_visible()
    this_week = calendar.get_by_text(re.compile(r"Week of \d{4}-\d{2}-\d{2}")).inner_text()

    # next week through htmx: the calendar fragment is swapped, the page is not reloaded
    page.evaluate("window.__notReloaded = true")
    with page.expect_response(lambda r: "week=" in r.url and r.request.headers.get("hx-request") == "true") as swap:
        calendar.get_by_role("link", name="next week →").click()
    assert swap.value.status == 200
    expect(calendar.get_by_text(re.compile(r"Week of "))).not_to_have_text(this_week)
    monday = dt.date.fromisoformat(this_week.removeprefix("Week of ")) + dt.timedelta(days=7)
    expect(page.locator("#booking-calendar")).to_contain_text(f"Week of {monday:%Y-%m-%d}")
    expect(page.locator("#booking-calendar table.cal")).not_to_have_count(0)
    assert page.evaluate("window.__notReloaded") is True
    expect(page.locator("#booking-form")).to_be_visible()  # the rest of the page stayed

    # book 4 a100 GPUs (one whole node) from now + 5 min for 30 min
    start = (timezone.now() + dt.timedelta(minutes=5)).replace(second=0, microsecond=0)
    end = start + dt.timedelta(minutes=30)
    form = page.locator("#booking-form")
    form.get_by_label("Team").select_option("vision")
    form.get_by_label("GPU type").select_option("a100")
    form.get_by_label("GPUs").fill("4")
    form.get_by_label("Start").fill(f"{start:%Y-%m-%dT%H:%M}")
    form.get_by_label("End").fill(f"{end:%Y-%m-%dT%H:%M}")
    form.get_by_label("Note").fill("browser booking")
    form.get_by_role("button", name="Book").click()
    expect(page.get_by_role("status")).to_contain_text("Booked: 4 × a100")
    booking = Booking.objects.get(note="browser booking")
    assert (booking.team, booking.gpus, booking.gpu_type, booking.status, booking.start, booking.end) == (
        portal.vision, 4, "a100", BookingStatus.APPROVED, start, end)  # fmt: skip
    row = _booking_row(page, booking)
    expect(row).to_contain_text("Approved")
    expect(row).to_contain_text(booking.reservation_name)
    expect(row).to_contain_text("2.00")  # GPU-hours

    # the real worker makes the reservation (the page does not poll): once it has, a reload shows it
    _wait_for_reservation(booking, ReservationState.ACTIVE)
    page.reload()
    expect(row).to_contain_text(ReservationState.ACTIVE.label)
    assert len(booking.nodes) == 1 and booking.nodes[0].startswith("a100-")
    expect(row).to_contain_text(booking.nodes[0])
    reservation = next(r for r in get_gateway().reservation_list() if r.name == booking.reservation_name)
    assert "vision" in reservation.accounts
    screenshot(page, "bookings")

    page.once("dialog", lambda dialog: dialog.accept())  # "Cancel booking …?" (site.js, data-confirm)
    row.get_by_role("button", name="Cancel").click()
    expect(page.get_by_role("status")).to_contain_text(f"Booking {booking.reservation_name}: cancel done.")
    expect(row).to_contain_text("Cancelled")
    expect(row.get_by_role("button")).to_have_count(0)
    booking.refresh_from_db()
    assert (booking.status, booking.cancelled_by) == (BookingStatus.CANCELLED, portal.bob)
    _wait_for_reservation(booking, ReservationState.DELETED)
    assert booking.reservation_name not in {r.name for r in get_gateway().reservation_list()}
    page.reload()
    expect(row).to_contain_text(ReservationState.DELETED.label)
    screenshot(page, "bookings-cancelled")
    browsing.assert_clean()
