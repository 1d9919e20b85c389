#!/usr/bin/env python3
"""`make test-site`: each host of the site (scripts/site, issue 42) killed in turn under load, and what
was lost counted. Not a pytest test (it needs the whole site, ~5 min): run after `scripts/site up`.

    .venv/bin/python tests/site/drive.py [--faults web1,redis,db,ctld,cut-web2,cut-db] [--json FILE]

Clients run through the load balancer the whole time, each in its own thread:
  api-alice, api-carol  the REST API with an API token: POST a job (an Idempotency-Key, the same key
                        again after a failure, as a careful script does), GET it, cancel every third;
  cli-bob               `gpuportal submit` (the CLI retries a keyed POST by itself), one job a time;
  form-dave             the job form as a plain HTTP session (login, GET /jobs/new/, POST with the CSRF
                        token and the form's hidden idempotency key, again after a failure: what a
                        browser's resubmit does), a submission every ~1 s;
  browser-dave          Debian's Chromium through Playwright, as tests/browser drives it (one headless
                        browser, one page, JavaScript on): logs in through the form, fills the job form,
                        clicks "Submit job"; on a 503 page waits its Retry-After and reloads (the form's
                        POST sent again: its key makes it one job). One submission every ~4 s: a
                        browser's CPU on 2 cores shared with CI's fast tier (--no-browser: without it);
  page-anon             GET /login/ with no session every second: a page that needs neither the database
                        nor Redis stays up while they fail over (the balancer checks /livez);
  decide-bob/admin      bookings by bob (auto-approved) and quota requests approved by admin: decisions
                        whose answer the client saw must all be in the database afterwards.
Meanwhile the site's Celery beat runs the job sync, the sweeper and the usage ingestion as usual.

Faults, in turn (`scripts/site kill HOST`: SIGKILL of every process of the host's namespace; `cut`:
its link down), each host started again (or its link mended) once the site has moved on:
  web1   a portal host                        redis  the Redis master (as Sentinel names it)
  db     the PostgreSQL primary (as the pg_auto_failover monitor names it)
  ctld   the primary slurmctld (ctl1)         cut-web2  web2's link cut for 8 s, then mended
  dbd    the site's slurmdbd (single: its messages wait in the controller), down 20 s
  cut-db the PostgreSQL primary's link cut until the standby is promoted, then mended
For each: requests failed (attempts of every client between the fault and the site whole again), the
longest gap a client saw between two answers, the time until `scripts/site wait-whole` passed; then
the cluster runs jobs again: a job starts, and no node stays idle with GPUs allocated while jobs wait
(Slurm 22.05 after a failback; the run fails otherwise).
At the end, the counts: jobs lost (accepted, not cancelled before relay, no Slurm id / not in Slurm by
its tag, read again until the jobs sync has re-sent what a controller lost), apart from them the jobs
the portal saw start that Slurm then forgot (a controller killed before its state save), jobs duplicated in Slurm (a tag `gpuportal:<uuid>` on more than one Slurm job), GPU-seconds
counted twice (usage records of a job beyond one, or their sum above sacct's GPUs × elapsed), decisions
lost (an answered booking or quota approval missing from the database), each client's jobs apart.
Exit 1 when any is not 0, or a client died."""

from __future__ import annotations

import argparse
import atexit
import datetime as dt
import http.client
import http.cookiejar
import json
import shutil
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # tests.browser's Chromium settings
SITE = [str(ROOT / "scripts" / "site")]
PASSWORD = os.environ.get("DEMO_PASSWORD", "gpuportal-demo")
TAG = "gpuportal:"
SCRIPT = "#!/bin/bash\ntrue\n"
LB = "10.77.0.10"
LOST_WAIT = 150.0
CTLD_FAILBACK = "stop-backup"  # or "handover" (--ctld-failback): how control goes back to ctl1
DBD_DOWN_S = 20  # slurmdbd down: jobs start and end meanwhile, their accounting waits in the controller
DBD_QUEUE_MAX: list[int] = []  # the controller's queue of accounting messages at its longest, per dbd fault
BROWSER_PAUSE = 3.0  # seconds between the browser's submissions: one browser on 2 cores beside CI's fast tier  # JOB_LOST_AFTER_SECONDS (60) and a few job syncs, on a loaded machine


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def site(*args: str, check: bool = True, timeout: float = 300) -> str:
    result = subprocess.run(SITE + list(args), capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise RuntimeError(f"scripts/site {' '.join(args)} failed ({result.returncode}): {result.stderr[-800:]}")
    return result.stdout


def site_env() -> dict[str, str]:
    env = {}
    for line in site("env").splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        env[name] = shlex.split(value)[0] if value else ""
    return env


# --------------------------------------------------------------------------- what the clients saw


class Recorder:
    """Every attempt of every client: (client, started, ended, ok)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.attempts: list[tuple[str, float, float, bool, str]] = []

    def add(self, client: str, started: float, ok: bool, what: str = "") -> None:
        with self.lock:
            self.attempts.append((client, started, time.monotonic(), ok, what))

    def window(self, start: float, end: float) -> dict:
        with self.lock:
            attempts = list(self.attempts)
        inside = [a for a in attempts if start <= a[1] <= end]
        failed = [a for a in inside if not a[3]]
        # the longest gap: between two answered requests of one client, over a stretch that touches the window
        gap, gap_client, gap_at = 0.0, "", (0.0, 0.0)
        for client in sorted({a[0] for a in attempts}):
            ends = sorted(a[2] for a in attempts if a[0] == client and a[3])
            for before, after in zip(ends, ends[1:]):
                if after >= start and before <= end and after - before > gap:
                    gap, gap_client, gap_at = after - before, client, (before, after)
        # what that client did in its longest gap (seconds from the fault's start): to explain it
        gap_attempts = [(round(a[1] - start, 1), round(a[2] - start, 1), a[3], a[4]) for a in attempts
                        if a[0] == gap_client and a[2] > gap_at[0] and a[1] < gap_at[1]]  # fmt: skip
        kinds: dict[str, int] = {}
        for a in failed:
            kinds[a[4]] = kinds.get(a[4], 0) + 1
        by_client: dict[str, list[int]] = {}
        for a in inside:
            tally = by_client.setdefault(a[0], [0, 0])
            tally[0] += 1
            tally[1] += 0 if a[3] else 1
        return {"requests": len(inside), "failed": len(failed), "failed_by": kinds, "by_client": by_client,
                "longest_gap_s": round(gap, 1), "longest_gap_client": gap_client,
                "longest_gap_from_to_s": [round(gap_at[0] - start, 1), round(gap_at[1] - start, 1)],
                "longest_gap_attempts": gap_attempts[:20]}


class Http:
    """One request per connection (a killed host's kept-alive socket would only add noise)."""

    def __init__(self, host: str = LB, timeout: float = 30):
        self.host, self.timeout = host, timeout

    def call(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        conn = http.client.HTTPConnection(self.host, 80, timeout=self.timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()


class Load:
    def __init__(self, tokens: dict[str, str], recorder: Recorder, cli_env: dict[str, str], browser: bool = True):
        self.tokens, self.rec, self.cli_env, self.browser = tokens, recorder, cli_env, browser
        self.browser_jobs = 0
        self.browser_cpu_s: float | None = None  # the browser's processes' CPU time over the run
        self.died: list[str] = []  # clients that ended with an exception: the run fails
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.jobs: dict[str, dict] = {}  # portal job id -> {"client", "cancelled"}
        self.bookings: dict[str, str] = {}  # booking id -> status answered
        self.quotas: dict[int, str] = {}  # quota id -> status answered by the approval
        self.errors: list[str] = []
        self.ages: list[tuple[float, float]] = []
        self.threads: list[threading.Thread] = []

    def sync_ages(self) -> None:
        """The Slurm inventory sync's age as /healthz reports it, every second: beat sends the sync every
        30 s, so an age well past that means no beat is sending (its host died and nobody took over)."""
        while not self.stop.is_set():
            try:
                status, _, data = Http(timeout=5).call("GET", "/healthz")
                age = json.loads(data)["checks"]["slurm"].get("age_seconds")
                if age is not None:
                    with self.lock:
                        self.ages.append((time.monotonic(), float(age)))
            except (OSError, ValueError, KeyError, http.client.HTTPException):  # IncompleteRead: its host killed mid-answer
                pass
            time.sleep(1)

    def max_sync_age(self, start: float, end: float) -> float | None:
        with self.lock:
            ages = [age for at, age in self.ages if start <= at <= end]
        return round(max(ages), 1) if ages else None

    def start(self) -> None:
        for name, target in (("api-alice", lambda: self.api_client("api-alice", "alice", "vision")),
                             ("api-carol", lambda: self.api_client("api-carol", "carol", "nlp")),
                             ("cli-bob", self.cli_client), ("form-dave", self.form_client),
                             ("decide", self.decisions), ("sync-age", self.sync_ages),
                             ("page-anon", self.anon_page)) + (
                                 (("browser-dave", self.browser_client),) if self.browser else ()):
            thread = threading.Thread(target=self._guard, args=(name, target), name=name, daemon=True)
            thread.start()
            self.threads.append(thread)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=150)

    def _guard(self, name, target) -> None:
        try:
            target()
        except Exception as exc:  # noqa: BLE001 — a client that dies is reported, the run fails
            self.errors.append(f"{name}: {exc!r}")
            self.died.append(name)
            log(f"client {name} died: {exc!r}")

    def _accepted(self, job_id: str, client: str) -> None:
        with self.lock:
            self.jobs.setdefault(job_id, {"client": client, "cancelled": False})

    # --- the API -----------------------------------------------------------------------------------
    def _api(self, client: str, user: str, method: str, path: str, payload=None, key: str | None = None,
             ok=(200, 201), what: str = ""):
        headers = {"Authorization": f"Token {self.tokens[user]}", "Accept": "application/json"}
        body = None
        if payload is not None:
            body = json.dumps(payload).encode()
            headers["Content-Type"] = "application/json"
        if key:
            headers["Idempotency-Key"] = key
        started = time.monotonic()
        try:
            status, _, data = Http().call(method, path, body, headers)
        except (OSError, http.client.HTTPException) as exc:
            self.rec.add(client, started, False, f"{what or method}: {type(exc).__name__}")
            return None, None
        # an answer of the portal's (a 4xx refusal included) is the site working; no answer or a 5xx is not
        good = status in ok or (400 <= status < 500 and status != 429)
        self.rec.add(client, started, good, f"{what or method}: {status}")
        try:
            parsed = json.loads(data or b"null")
        except ValueError:
            parsed = None
        return status, parsed

    def _until(self, fn, limit: float = 120, stop_aware: bool = False):
        """Repeat fn() (which returns a value or None on failure) until it answers or limit passes (or,
        stop_aware, the load stops: what is not under way yet is not started)."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and not (stop_aware and self.stop.is_set()):
            value = fn()
            if value is not None:
                return value
            time.sleep(0.5)
        return None

    def api_client(self, client: str, user: str, team: str) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            key = uuid.uuid4().hex
            body = {"team": team, "name": f"site-{client}-{n}", "script": SCRIPT, "partition": "debug",
                    "gpus": 1, "time_limit_minutes": 1}

            def post():
                status, answer = self._api(client, user, "POST", "/api/v1/jobs/", body, key=key, what="POST job")
                if status in (200, 201):  # 200: the key's job, made by an attempt whose answer was lost
                    return answer["id"]
                if status is not None and status < 500 and status not in (408, 429):
                    self.errors.append(f"{client}: POST answered {status}: {str(answer)[:300]}")
                    return "refused"
                return None

            job_id = self._until(post)
            if job_id in (None, "refused"):
                continue
            self._accepted(job_id, client)
            self._until(lambda: self._api(client, user, "GET", f"/api/v1/jobs/{job_id}/", what="GET job")[1])
            if n % 3 == 0:
                def cancel():
                    status, answer = self._api(client, user, "POST", f"/api/v1/jobs/{job_id}/cancel/", {},
                                               ok=(200, 202, 409), what="cancel")
                    return answer if status in (200, 202, 409) else None
                if self._until(cancel) is not None:
                    with self.lock:
                        self.jobs[job_id]["cancelled"] = True
            time.sleep(0.3)

    # --- the CLI -------------------------------------------------------------------------------------
    def cli_client(self) -> None:
        # the directory `gpuportal submit` runs in is the job's submit directory: it must outlive the
        # clients, as a user's does, for a job Slurm lost to be sent again from it (removed at exit)
        tmp = tempfile.mkdtemp(prefix="gpuportal-site-cli-")
        os.chmod(tmp, 0o1777)  # the job runs as bob and writes its slurm-<id>.out here (mkdtemp: 0700 root)
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        if True:
            script = Path(tmp) / "job.sh"
            script.write_text(SCRIPT)
            n = 0
            while not self.stop.is_set():
                n += 1
                started = time.monotonic()
                result = subprocess.run(
                    [str(ROOT / ".venv" / "bin" / "gpuportal"), "submit", "--team", "vision", "--gpus", "1",
                     "--time", "1", "-p", "debug", "--name", f"site-cli-{n}", "--json", str(script)],
                    capture_output=True, text=True, timeout=300, env={**self.cli_env, "XDG_CONFIG_HOME": tmp},
                    cwd=tmp)
                ok = result.returncode == 0
                what = f"gpuportal submit: exit {result.returncode}"
                if ok and time.monotonic() - started > 10:  # slow: its retries' warnings say why
                    what += f" after {time.monotonic() - started:.1f} s: {result.stderr.strip()[-300:]}"
                self.rec.add("cli-bob", started, ok, what)
                if ok:
                    answer = json.loads(result.stdout)
                    answer = answer[0] if isinstance(answer, list) else answer
                    self._accepted(answer["id"], "cli-bob")
                else:
                    log(f"gpuportal submit failed (exit {result.returncode}): {result.stderr.strip()[-300:]}")
                time.sleep(0.5)

    # --- the browser's form ------------------------------------------------------------------------
    def form_client(self) -> None:
        jar = http.cookiejar.CookieJar()

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args, **kwargs):
                return None

        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), NoRedirect)
        base = f"http://{LB}"

        def fetch(method, path, form=None):
            data = urllib.parse.urlencode(form).encode() if form is not None else None
            request = urllib.request.Request(base + path, data=data, method=method,
                                             headers={"Referer": base + path})
            try:
                with opener.open(request, timeout=30) as response:
                    return response.status, response.headers, response.read().decode(errors="replace")
            except urllib.error.HTTPError as error:  # headers: an HTTPMessage (names in any case)
                return error.code, error.headers, error.read().decode(errors="replace")

        def step(what, method, path, form=None, ok=(200,)):
            started = time.monotonic()
            try:
                status, headers, page = fetch(method, path, form)
            except (OSError, http.client.HTTPException) as exc:
                self.rec.add("form-dave", started, False, f"{what}: {type(exc).__name__}")
                return None, None, None
            self.rec.add("form-dave", started, status in ok or status in (400, 409), f"{what}: {status}")
            return status, headers, page

        def csrf(page):
            found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page or "")
            return found.group(1) if found else None

        def login():
            status, _, page = step("GET login", "GET", "/login/", ok=(200, 302))
            if status == 302:  # still logged in
                return True
            token = csrf(page)
            if not token:
                return False
            status, headers, _ = step("POST login", "POST", "/login/",
                                      {"username": "dave", "password": PASSWORD, "csrfmiddlewaretoken": token}, ok=(302,))
            return status == 302

        n = 0
        logged_in = False
        while not self.stop.is_set():
            if not logged_in:
                logged_in = bool(self._until(lambda: login() or None, stop_aware=True))
                continue
            status, headers, page = step("GET form", "GET", "/jobs/new/", ok=(200,))
            if status == 302:  # the session is gone (it lived in a database that failed over?)
                logged_in = False
                continue
            token = csrf(page)
            key = re.search(r'name="idempotency_key" value="([^"]+)"', page or "")
            if not token or not key:
                time.sleep(0.5)
                continue
            n += 1
            form = {"csrfmiddlewaretoken": token, "idempotency_key": key.group(1), "team": "nlp", "script": SCRIPT,
                    "name": f"site-form-{n}", "partition": "debug", "gpus": "1", "time_limit_minutes": "1"}

            def post():
                status, headers, page = step("POST form", "POST", "/jobs/new/", form, ok=(302,))
                if status == 302:
                    location = headers.get("Location", "")
                    found = re.search(r"/jobs/([0-9a-f-]{36})/", location)
                    if not found:
                        log(f"form-dave: POST /jobs/new/ redirected to {location!r}")
                    return found.group(1) if found else "login"
                if status in (200, 400, 403):  # the form again with its errors: refused, not retried
                    self.errors.append(f"form-dave: POST /jobs/new/ answered {status}")
                    return "refused"
                return None

            job_id = self._until(post)
            if job_id == "login":
                logged_in = False
            elif job_id not in (None, "refused"):
                self._accepted(job_id, "form-dave")
            time.sleep(0.7)

    # --- a page that needs neither the database nor Redis -------------------------------------------------
    def anon_page(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                status, _, _ = Http(timeout=10).call("GET", "/login/")
                self.rec.add("page-anon", started, status == 200, f"GET login anonymous: {status}")
            except (OSError, http.client.HTTPException) as exc:
                self.rec.add("page-anon", started, False, f"GET login anonymous: {type(exc).__name__}")
            time.sleep(1)

    # --- the browser ----------------------------------------------------------------------------------
    def browser_client(self) -> None:
        """Debian's Chromium driven by Playwright, as the browser tests drive it (tests/browser/conftest.py:
        the same binary and flags; `playwright install` is never run): one headless browser, one page, with
        JavaScript (htmx posts the estimate as fields change). Logs in through the form, opens the job
        form, fills it and clicks "Submit job", one job every BROWSER_PAUSE seconds. A 5xx page (the
        portal's or HAProxy's 503) is met as a person meets it: wait for its Retry-After, reload — for the
        form's POST that sends the same form again (its hidden idempotency key: one job); no answer at
        all (a cut connection) likewise. Every navigation is an attempt in the same records as the other
        clients'; the job it lands on counts with the others'."""
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import sync_playwright

        from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS

        client = "browser-dave"
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, timeout=60_000,
                                                 args=CHROMIUM_ARGS + ["--renderer-process-limit=1"])
            try:
                context = browser.new_context(base_url=f"http://{LB}", locale="en-GB", timezone_id="UTC")
                context.set_default_timeout(30_000)
                page = context.new_page()

                def answered(what: str, navigate) -> tuple[int | None, float]:
                    """One navigation (a goto, a reload, a click that loads a page): its final status (None
                    when no page came) and the wait its Retry-After asks for (2 s without one); recorded."""
                    started = time.monotonic()
                    try:
                        response = navigate()
                    except PlaywrightError as exc:
                        self.rec.add(client, started, False, f"{what}: {str(exc).splitlines()[0][:60]}")
                        return None, 2.0
                    status = response.status if response is not None else 200
                    self.rec.add(client, started, status < 500, f"{what}: {status}")
                    retry_after = (response.headers.get("retry-after") or "") if response is not None else ""
                    return status, min(float(retry_after), 10.0) if retry_after.isdigit() else 2.0

                def until_page(what: str, first) -> bool:
                    """first(), then after each 5xx page a reload once its Retry-After passed (after no
                    answer at all, first() again: the page in front of the user is still the one before)."""
                    status, wait = answered(what, first)
                    tries = 0
                    while (status is None or status >= 500) and not self.stop.is_set() and tries < 120:
                        tries += 1
                        time.sleep(wait)
                        if status is None:
                            status, wait = answered(f"{what} (again)", first)
                        else:
                            status, wait = answered(f"{what} (reload)", lambda: page.reload(wait_until="load"))
                    return status is not None and status < 500

                def log_in() -> bool:
                    if not until_page("GET login", lambda: page.goto("/login/")):
                        return False
                    if "/login/" not in page.url:  # still logged in
                        return True
                    page.get_by_label("User name").fill("dave")
                    page.get_by_label("Password").fill(PASSWORD)
                    button = page.get_by_role("button", name="Log in")
                    ok = until_page("POST login", lambda: self._click_to_page(page, button))
                    return ok and "/login/" not in page.url

                n = 0
                logged_in = False
                while not self.stop.is_set():
                    if not logged_in:
                        logged_in = log_in()
                        if not logged_in:
                            time.sleep(1)
                        continue
                    if not until_page("GET form", lambda: page.goto("/jobs/new/")):
                        continue
                    if "/login/" in page.url:  # the session is gone
                        logged_in = False
                        continue
                    if not page.url.endswith("/jobs/new/"):
                        self.errors.append(f"{client}: GET /jobs/new/ ended on {page.url}")
                        time.sleep(1)
                        continue
                    n += 1
                    name = f"site-browser-{n}"
                    try:
                        page.get_by_label("Team:", exact=True).select_option("nlp")
                        page.get_by_label("Name:", exact=True).fill(name)
                        page.get_by_label("Partition:", exact=True).select_option("debug")
                        page.get_by_label("GPUs:", exact=True).fill("1")
                        page.get_by_label("Time limit:", exact=True).fill("1")
                        page.get_by_label("Script:", exact=True).fill(SCRIPT)
                        page.get_by_label("Script:", exact=True).press("Tab")
                        # the estimate's htmx request (on change, and on keyup after 300 ms) settles first:
                        # a click racing its swap can miss the button, as a person's can
                        time.sleep(0.5)
                        page.locator("form.htmx-request").wait_for(state="detached", timeout=30_000)
                    except PlaywrightError as exc:  # the form's page went away under us (a reload, a fault)
                        self.rec.add(client, time.monotonic(), False, f"fill form: {str(exc).splitlines()[0][:60]}")
                        continue
                    button = page.get_by_role("button", name="Submit job")
                    status, wait = answered("POST form", lambda: self._click_to_page(page, button))
                    tries = 0
                    while (status is None or status >= 500) and not self.stop.is_set() and tries < 120:
                        tries += 1
                        time.sleep(wait)
                        if button.count():  # no page came: the form is still there, its key unchanged
                            status, wait = answered("POST form (again)", lambda: self._click_to_page(page, button))
                        else:  # the 503 page of the POST: reloading it sends the same form again
                            status, wait = answered("POST form (reload)", lambda: page.reload(wait_until="load"))
                    if status is None or status >= 500:
                        continue
                    found = re.search(r"/jobs/([0-9a-f-]{36})/$", page.url)
                    if found:
                        self._accepted(found.group(1), client)
                        with self.lock:
                            self.browser_jobs += 1
                    elif "/login/" in page.url:
                        logged_in = False
                    else:
                        self.errors.append(f"{client}: the form's POST ended on {page.url}: "
                                           f"{page.locator('[role=alert]').all_inner_texts()[:3]}")
                    time.sleep(BROWSER_PAUSE)
                self.browser_cpu_s = chromium_cpu_seconds()
            finally:
                browser.close()

    @staticmethod
    def _click_to_page(page, button):
        """Click and wait for the page it loads; its response (the redirect's target, after a POST)."""
        with page.expect_navigation(wait_until="load") as navigation:
            button.click()
        return navigation.value

    # --- bookings and quota decisions ------------------------------------------------------------------
    def decisions(self) -> None:
        n = 0
        # a window of this run's own (whole a100 nodes are booked: runs must not meet each other's bookings)
        base = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0) + dt.timedelta(
            days=2, hours=int.from_bytes(os.urandom(2), "big") % (24 * 20))
        while not self.stop.is_set():
            n += 1
            start = base + dt.timedelta(minutes=30 * n)
            status, answer = self._api("decide", "bob", "POST", "/api/v1/bookings/", {
                "team": "vision", "gpu_type": "a100", "gpus": 4, "start": start.isoformat(),
                "end": (start + dt.timedelta(minutes=30)).isoformat(), "note": f"site-{n}"}, what="POST booking")
            if status == 201:
                with self.lock:
                    self.bookings[answer["id"]] = answer["status"]
            elif status is not None and status < 500:
                self.errors.append(f"decide: POST booking answered {status}: {str(answer)[:200]}")
            # each approval supersedes the team's quota of the period: large, so that budgets never refuse jobs here
            status, answer = self._api("decide", "dave", "POST", "/api/v1/quotas/", {
                "team": "nlp", "gpu_hours": f"{100000 + n}.00", "justification": f"site test {n}"}, what="POST quota")
            if status == 201:
                quota_id = answer["id"]
                status, answer = self._api("decide", "admin", "POST", f"/api/v1/quotas/{quota_id}/approve/", {},
                                           what="approve quota")
                if status == 200:
                    with self.lock:
                        self.quotas[quota_id] = answer["state"]
            time.sleep(1.5)


# --------------------------------------------------------------------------- faults


def sentinel_master() -> str:
    return site("_redis_master", check=False).strip() or "r1"


def pg_primary() -> str:
    return site("_pg_primary", check=False).strip() or "db1"


def ctld_primary_answers() -> bool:
    out = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "SLURM_CONF": "/var/lib/gpuportal-site/slurm/etc/slurm.conf"}).stdout
    return "at ctl1 is UP" in out


def chromium_cpu_seconds() -> float:
    """CPU seconds (user + system, their reaped children's included) of the Chromium processes under this
    one (Playwright's driver starts the browser, the browser its renderer and GPU/network processes)."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    stats: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        parents[int(entry.name)] = int(fields[1])
        stats[int(entry.name)] = (comm, sum(int(v) for v in fields[11:15]) / tick)

    def ours(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    # the browser's main process has its descendants' CPU time in its children fields once they are reaped;
    # the live ones are added up separately (a process's own fields never include a live child's)
    return round(sum(cpu for pid, (comm, cpu) in stats.items() if comm.startswith("chrom") and ours(pid)), 1)


def wait_for(predicate, limit: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < limit:
        try:
            if predicate():
                break
        except Exception:  # noqa: BLE001 — polled again
            pass
        time.sleep(0.3)
    return time.monotonic() - started


def fault(name: str) -> tuple[str, str, callable]:
    """(what is done, host, how it comes back): the host is picked when the fault starts."""
    if name == "web1":
        return "SIGKILL every process of web1", "web1", lambda h: (time.sleep(5), site("start", h))
    if name == "redis":
        host = sentinel_master()
        old = host

        def back(h):
            wait_for(lambda: sentinel_master() != old, 30)
            site("start", h)
        return f"SIGKILL every process of the Redis master {host}", host, back
    if name == "db":
        host = pg_primary()

        def back(h):
            wait_for(lambda: pg_primary() not in ("", h), 60)
            site("start", h)
        return f"SIGKILL every process of the PostgreSQL primary {host}", host, back
    if name == "ctld":
        def back(h):
            # the backup takes over after SlurmctldTimeout (6 s) of silence and loads the saved state; ctl1
            # comes back once ctl2 serves (squeue answers: a backup in standby refuses it), as an operator
            # brings a repaired host back — not while ctl2 is still loading what ctl1 left
            waited = wait_for(lambda: subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, timeout=30,
                                                     env=SITE_SLURM).returncode == 0, 90)
            log(f"fault ctld: ctl2 serves after {waited:.1f} s")
            time.sleep(5)
            if CTLD_FAILBACK == "handover":  # ctl1 started while ctl2 is in control: Slurm's REQUEST_CONTROL
                site("start", h)
            else:  # docs/deploy.md's failback: ctl2 stopped (its state saved whole), then ctl1, then ctl2
                site("ctld-failback")
        return "SIGKILL every process of the primary slurmctld's host ctl1", "ctl1", back
    if name == "dbd":  # accounting: single (docs/deploy.md); the controllers keep its messages meanwhile
        def back(h):
            queued = []
            for _ in range(DBD_DOWN_S):
                found = re.search(r"DBD Agent queue size:\s*(\d+)", slurm_out("sdiag"))
                queued.append(int(found.group(1)) if found else 0)
                time.sleep(1)
            DBD_QUEUE_MAX.append(max(queued, default=0))
            site("start", h)
        return f"SIGKILL slurmdbd, down {DBD_DOWN_S} s", "dbd", back
    if name == "cut-db":  # the primary cut off: it must stop taking writes before the standby is promoted
        host = pg_primary()

        def back(h):
            wait_for(lambda: pg_primary() not in ("", h), 60)
            site("mend", h)
        return f"cut the PostgreSQL primary {host}'s link until the standby is promoted", host, back
    if name.startswith("cut-"):
        host = name.removeprefix("cut-")
        return f"cut {host}'s link for 8 s", host, lambda h: (time.sleep(8), site("mend", h))
    raise SystemExit(f"unknown fault {name}")


SITE_SLURM = {**os.environ, "SLURM_CONF": "/var/lib/gpuportal-site/slurm/etc/slurm.conf"}


def slurm_out(*command: str) -> str:
    return subprocess.run(list(command), capture_output=True, text=True, timeout=30, env=SITE_SLURM).stdout


def duplicate_jobid_resume(fault: str) -> list[str]:
    """Nodes Slurm drained for "Duplicate jobid" — a node still runs a job under an id the controller
    gave again to another job after a takeover lost the first (Slurm 22.05; docs/deploy.md) — resumed
    as the operator's procedure says (`scontrol update nodename=… state=resume`). Returns them."""
    drained = [line.split("|", 1)[0] for line in slurm_out("sinfo", "-h", "-N", "-t", "drain,drained,draining",
                                                              "-o", "%N|%E").splitlines() if "Duplicate jobid" in line]  # fmt: skip
    for node in sorted(set(drained)):
        log(f"fault {fault}: Slurm drained {node} for a duplicate job id after the takeover; resumed (docs/deploy.md)")
        slurm_out("scontrol", "update", f"nodename={node}", "state=resume")
    return sorted(set(drained))


def gpus_held_by_no_job() -> list[str]:
    """Nodes IDLE (no job) on which Slurm still counts GPUs allocated: "a100-01 gres/gpu=4"."""
    held = []
    for line in slurm_out("scontrol", "show", "node", "-o").splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        gpus = re.search(r"gres/gpu=(\d+)", fields.get("AllocTRES", ""))
        if gpus and int(gpus.group(1)) and fields.get("State", "").split("+")[0] == "IDLE":
            held.append(f"{fields.get('NodeName')} gres/gpu={gpus.group(1)}")
    return held


def runs_jobs(since: float, limit: float) -> dict:
    """Within `limit` s: a job starts after `since` (wall clock; the clients keep submitting; a pending
    job's StartTime is only Slurm's guess, not counted), and no node stays idle with GPUs allocated
    while jobs wait. Sampled every 2 s; held GPUs that clear are not counted."""
    started_after = None
    held: list[str] = []
    pending = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        try:
            held = gpus_held_by_no_job()
            queue = [line.split("|") for line in slurm_out("squeue", "-h", "-t", "all", "-o", "%T|%S").splitlines()]
        except (OSError, subprocess.SubprocessError):
            time.sleep(2)
            continue
        pending = sum(1 for state, _ in queue if state == "PENDING")
        starts = [dt.datetime.fromisoformat(start).timestamp() for state, start in queue
                  if state != "PENDING" and start[:2] == "20"]
        if started_after is None and any(start >= since for start in starts):
            started_after = round(time.monotonic() - t0, 1)
        if started_after is not None and not held:
            break
        time.sleep(2)
    return {"job_started": started_after is not None, "gpus_held_by_no_job": held if pending else [],
            "pending": pending}


def portal_conditions(token: str) -> list[str]:
    """The condition codes of the site cluster's health as the portal shows them (GET /api/v1/clusters/)."""
    try:
        status, _, data = Http(timeout=10).call("GET", "/api/v1/clusters/", headers={"Authorization": f"Token {token}"})
        return [c["code"] for cluster in json.loads(data)["results"] for c in cluster["health"]["conditions"]] \
            if status == 200 else []
    except (OSError, ValueError, KeyError, http.client.HTTPException):
        return []


def cluster_runs_jobs(since: float, token: str) -> dict:
    """After a fault, the cluster runs jobs again (runs_jobs). Slurm 22.05 has left GPUs allocated on idle
    nodes after the primary controller took control back (finding 7): when that holds, the portal's
    cluster health must name it (`gpus_held_by_no_job`, read through the API once the inventory sync has
    seen it), and the operator's remedy in docs/deploy.md — `scontrol reconfigure` — must make the
    cluster run jobs again. The run fails when jobs do not run again after it, or the portal missed it."""
    runs = runs_jobs(since, 45)
    if not runs["gpus_held_by_no_job"]:
        return runs
    held = runs["gpus_held_by_no_job"]
    log(f"GPUs held by no job on idle nodes while {runs['pending']} jobs wait: {held}; the portal must say so")
    runs["portal_saw_it"] = wait_for(lambda: "gpus_held_by_no_job" in portal_conditions(token), 100) < 100
    remedy = time.time()
    slurm_out("scontrol", "reconfigure")
    after = runs_jobs(remedy, 60)
    log(f"after scontrol reconfigure: {after}")
    return {**after, "held_before_remedy": held, "portal_saw_it": runs["portal_saw_it"], "remedy": "scontrol reconfigure"}


CTLD_EVENTS = {  # what the controllers' logs say of jobs across a takeover and a failback
    "jobs_lost": ("Vestigial state files for JobId", "Purged files for defunct batch JobId"),
    "jobs_requeued_missing_from_node": ("missing from batch node",),
}


def ctld_events(since: float) -> dict[str, int]:
    """Counts of CTLD_EVENTS in ctl1's and ctl2's slurmctld logs from `since` (wall clock) on."""
    counts = {name: 0 for name in CTLD_EVENTS}
    for host in ("ctl1", "ctl2"):
        try:
            lines = Path(f"/var/lib/gpuportal-site/hosts/{host}/slurmctld.log").read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if not line.startswith("[20"):
                continue
            try:
                at = dt.datetime.fromisoformat(line[1:24]).timestamp()
            except ValueError:
                continue
            if at >= since:
                for name, needles in CTLD_EVENTS.items():
                    counts[name] += any(needle in line for needle in needles)
    return counts


def run_fault(name: str, recorder: Recorder, load: Load) -> dict:
    what, host, back = fault(name)
    log(f"fault {name}: {what}")
    t0, wall0 = time.monotonic(), time.time()
    if name.startswith("cut-"):
        site("cut", host)
    else:
        site("kill", host)
    back(host)
    log(f"fault {name}: {host} back after {time.monotonic() - t0:.1f} s; waiting until the site is whole")
    whole_ok, resumed, deadline = False, [], time.monotonic() + 150
    while not whole_ok and time.monotonic() < deadline:
        waited = subprocess.run(SITE + ["wait-whole", "10"], capture_output=True, text=True)
        whole_ok = waited.returncode == 0
        if not whole_ok:
            resumed += duplicate_jobid_resume(name)
    if not whole_ok:  # what was not whole: scripts/site's status, which wait-whole prints when it gives up
        log(f"fault {name}: the site is not whole after 150 s; scripts/site status:\n" + (waited.stderr or waited.stdout)[-3000:])
    whole, whole_wall = time.monotonic() - t0, time.time()
    time.sleep(3)
    figures = {"fault": name, "what": what, "host": host, "whole_again_s": round(whole, 1) if whole_ok else None, "nodes_resumed": resumed,
               "wall": [wall0, time.time()],
               **recorder.window(t0, time.monotonic()), "max_sync_age_s": load.max_sync_age(t0, time.monotonic())}
    if name == "dbd" and DBD_QUEUE_MAX:
        figures["dbd_agent_queue_max"] = DBD_QUEUE_MAX[-1]
    figures["runs_jobs_again"] = runs = cluster_runs_jobs(whole_wall, load.tokens["admin"])
    if name == "ctld":
        figures["ctld_failback"] = CTLD_FAILBACK
        figures["ctld_events"] = ctld_events(wall0)
    if not runs["job_started"] or runs["gpus_held_by_no_job"]:
        log(f"fault {name}: the cluster does not run jobs again: {runs}")
    log(f"fault {name}: {json.dumps(figures)}")
    return figures


# --------------------------------------------------------------------------- the counts


def slurm_view(since: str, slurm_ids: list[int]) -> tuple[dict[str, list[str]], dict[str, int], dict[str, str], set[str]]:
    """What Slurm holds: {portal job id: [Slurm job ids carrying its tag]}, {Slurm id (and "id|portal job id",
    each record of a reused id apart): GPU-seconds} and
    {Slurm id: state} from accounting (the run's window, and the portal's Slurm ids by id: a record whose
    job never became eligible is outside any -S/-E window), and the ids the controller's queue holds."""
    env = {**os.environ, "SLURM_CONF": "/var/lib/gpuportal-site/slurm/etc/slurm.conf"}
    fields = ["-o", "JobID,Comment,AllocTRES,ElapsedRaw,State"]
    out = subprocess.run(["sacct", "-a", "-X", "-n", "--parsable2", "-S", since, "-E", "now"] + fields,
                         capture_output=True, text=True, timeout=60, env=env).stdout
    if slurm_ids:
        out += subprocess.run(["sacct", "-a", "-X", "-n", "--parsable2", "-j", ",".join(map(str, slurm_ids))] + fields,
                              capture_output=True, text=True, timeout=60, env=env).stdout
    by_tag: dict[str, set[str]] = {}
    gpu_seconds: dict[str, int] = {}
    states: dict[str, str] = {}
    for line in out.splitlines():
        job, comment, tres, elapsed, state = (line.split("|") + [""] * 5)[:5]
        gpus = re.search(r"gres/gpu=(\d+)", tres)
        gpu_seconds[job] = int(gpus.group(1)) * int(elapsed or 0) if gpus else 0
        states[job] = state.split()[0] if state else ""
        if comment.startswith(TAG):
            by_tag.setdefault(comment.removeprefix(TAG), set()).add(job)
    # a Slurm id with several accounting records — handed out again after a takeover, or a job Slurm
    # requeued and ran again (finding 8) — has one per run: -D lists them all, each keyed by id, tag and
    # start, so that a usage record is compared with the run it stands for, not with the newest
    if slurm_ids:
        for line in subprocess.run(["sacct", "-a", "-X", "-n", "-D", "--parsable2", "-j", ",".join(map(str, slurm_ids)),
                                    "-o", "JobID,Comment,AllocTRES,ElapsedRaw,Start"],
                                   capture_output=True, text=True, timeout=60, env=env).stdout.splitlines():
            job, comment, tres, elapsed, start = (line.split("|") + [""] * 5)[:5]
            gpus = re.search(r"gres/gpu=(\d+)", tres)
            if comment.startswith(TAG) and start[:2] == "20":
                key = f"{job}|{comment.removeprefix(TAG)}|{dt.datetime.fromisoformat(start).timestamp():.0f}"
                gpu_seconds[key] = max(gpu_seconds.get(key, 0), int(gpus.group(1)) * int(elapsed or 0) if gpus else 0)
    queue = subprocess.run(["squeue", "-h", "-o", "%A|%k"], capture_output=True, text=True, timeout=60, env=env).stdout
    queued = set()
    for line in queue.splitlines():
        job, _, comment = line.partition("|")
        queued.add(job)
        if comment.startswith(TAG):
            by_tag.setdefault(comment.removeprefix(TAG), set()).add(job)
    return {tag: sorted(ids) for tag, ids in by_tag.items()}, gpu_seconds, states, queued


def db_rows(dsn: str, jobs: list[str], bookings: list[str], quotas: list[int]) -> dict:
    import psycopg  # the portal's own driver (the venv's)

    with psycopg.connect(dsn) as conn:
        # the state's reason too: a lost job's detail says what Slurm answered (a SUBMIT_FAILED job of the
        # twenty-first session's CI run, sent in the first second of the slurmctld SIGKILL, said nothing)
        job_rows = {str(r[0]): {"state": r[1], "slurm_job_id": r[2], "created": r[3].timestamp(),
                                "submitted": r[4].timestamp() if r[4] else None, "started": r[5] is not None,
                                "reason": (r[6] or "")[:300]}
                    for r in conn.execute("select id, state, slurm_job_id, created_at, submitted_at, started_at, "
                                          "state_reason from jobs_job where id = any(%s)", [jobs])}
        usage = [(str(r[0]), str(r[1]), r[2], r[3].timestamp()) for r in conn.execute(
            "select portal_job_uuid, job_id, gpu_seconds, start_time from accounting_usagerecord "
            "where portal_job_uuid = any(%s)",
            [jobs])]
        booking_rows = {str(r[0]): r[1] for r in conn.execute(
            "select id, status from accounting_booking where id = any(%s)", [bookings])}
        quota_rows = {r[0]: r[1] for r in conn.execute("select id, state from accounting_quota where id = any(%s)",
                                                       [quotas])}
    return {"jobs": job_rows, "usage": usage, "bookings": booking_rows, "quotas": quota_rows}


def relay_waits(rows: dict, faults: list[dict]) -> None:
    """Each fault's longest wait of a job accepted during it for its Slurm id (created → submitted)."""
    # each fault's jobs: from its start to the next fault's (a job accepted between two windows counts)
    ends = [f["wall"][0] for f in faults[1:]] + [float("inf")]
    for figures, end in zip(faults, ends):
        start, _ = figures.pop("wall")
        waits = [r["submitted"] - r["created"] for r in rows.values() if start <= r["created"] <= end and r["submitted"]]
        figures["jobs_accepted"] = sum(1 for r in rows.values() if start <= r["created"] <= end)
        figures["longest_accept_to_slurm_s"] = round(max(waits), 1) if waits else None


def counts(load: Load, env: dict[str, str], since: str, faults: list[dict]) -> dict:
    jobs = dict(load.jobs)
    ids = list(jobs)
    dsn = env["DATABASE_URL"]
    if "," not in dsn:  # plain URLs: the current primary's
        dsn = re.sub(r"@[^/]+/", f"@10.77.0.{21 if pg_primary() == 'db1' else 22}:5432/", dsn)

    def settled() -> bool:
        rows = db_rows(dsn, ids, [], [])["jobs"]
        return all(r["slurm_job_id"] or r["state"] in ("CANCELLED", "SUBMIT_FAILED") for r in rows.values()) \
            and len(rows) == len(ids)

    log(f"counts: waiting until each of the {len(ids)} accepted jobs has a Slurm id (or was cancelled first)")
    waited = wait_for(settled, 180)
    log(f"counts: settled after {waited:.1f} s; ingesting usage once more")
    subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "manage.py", "ingest_usage"], cwd=ROOT, capture_output=True,
                   timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": "/root", **env, "DATABASE_URL": dsn})
    # A job a controller lost in a takeover is sent again by the jobs sync once JOB_LOST_AFTER_SECONDS
    # (60 s) have passed: the counts are read again until nothing is missing or LOST_WAIT has passed
    deadline = time.monotonic() + LOST_WAIT
    while True:
        rows = db_rows(dsn, ids, list(load.bookings), list(load.quotas))
        slurm_ids = sorted({r["slurm_job_id"] for r in rows["jobs"].values() if r["slurm_job_id"]})
        by_tag, gpu_seconds, states, queued = slurm_view(since, slurm_ids)

        def in_slurm(job: str) -> bool:
            """Slurm has the job: its tag on a job the controller holds or that left the queue having run
            (accounting's PENDING for an id the queue no longer holds: the controller lost it)."""
            return any(sid in queued or states.get(sid, "PENDING") != "PENDING" for sid in by_tag.get(job, []))

        missing = [j for j in ids if j not in rows["jobs"]
                   or (not in_slurm(j) and not (rows["jobs"][j]["state"] == "CANCELLED" and not rows["jobs"][j]["slurm_job_id"]))]
        # a job the portal saw start (the queue said RUNNING) that Slurm then forgot — a controller killed
        # before saving it, its accounting never sent: it ran, so it is not sent again, and it is not lost
        # (it has its Slurm id); counted apart: its state and its GPU-seconds are never known
        unrecorded = [j for j in missing if j in rows["jobs"] and rows["jobs"][j]["started"] and rows["jobs"][j]["slurm_job_id"]]
        lost = [j for j in missing if j not in unrecorded]
        if not lost or time.monotonic() > deadline:
            break
        log(f"counts: {len(lost)} accepted job(s) not in Slurm yet; again in 5 s")
        time.sleep(5)
    relay_waits(rows["jobs"], faults)
    lost_detail = [{"job": j, **rows["jobs"].get(j, {}), "tagged": by_tag.get(j, []),
                    "accounting": [states.get(sid) for sid in by_tag.get(j, [])]} for j in missing]
    duplicated = {j: by_tag[j] for j in ids if len(by_tag.get(j, [])) > 1}
    by_client: dict[str, dict[str, int]] = {}
    for job, seen in jobs.items():
        tally = by_client.setdefault(seen["client"], {"accepted": 0, "lost": 0, "duplicated": 0})
        tally["accepted"] += 1
        tally["lost"] += job in lost
        tally["duplicated"] += job in duplicated
    # counted twice: two usage records of one run (a job's Slurm id and start), or a record above what
    # accounting says that run used; a job Slurm ran twice (requeued: finding 8) has a record per run
    records: dict[tuple, list] = {}
    for job, slurm_id, seconds, start in rows["usage"]:
        records.setdefault((job, slurm_id, round(start)), []).append(seconds)
    twice = 0
    for (job, slurm_id, start), recs in records.items():
        twice += sum(recs[1:])
        accounted = gpu_seconds.get(f"{slurm_id}|{job}|{start}", gpu_seconds.get(slurm_id, recs[0]))
        twice += max(0, recs[0] - accounted)
    runs_per_job: dict[str, int] = {}
    for job, _, _ in records:
        runs_per_job[job] = runs_per_job.get(job, 0) + 1
    ran_twice = sorted(job for job, n in runs_per_job.items() if n > 1)
    # a decision the client was told of is lost when its row is gone or back to "requested" (an approved
    # quota may since be superseded by a later approval, a booking cancelled by its cleanup: both decided)
    decisions_lost = [b for b in load.bookings if rows["bookings"].get(b, "requested") == "requested"
                      and load.bookings[b] != "requested"] + [b for b in load.bookings if b not in rows["bookings"]] + \
        [q for q in load.quotas if rows["quotas"].get(q, "requested") == "requested"]
    return {"jobs_accepted": len(ids), "jobs_cancelled_by_clients": sum(1 for j in jobs.values() if j["cancelled"]),
            "jobs_in_slurm": sum(1 for j in ids if in_slurm(j)), "jobs_lost": len(lost),
            "jobs_started_then_unknown_to_slurm": len(unrecorded), "lost": lost_detail[:10],
            "jobs_duplicated_in_slurm": len(duplicated), "duplicated": dict(list(duplicated.items())[:10]),
            "jobs_by_client": by_client,
            "usage_records": len(rows["usage"]), "gpu_seconds_counted_twice": twice,
            "jobs_run_twice_by_slurm": len(ran_twice), "run_twice": ran_twice[:10],
            "bookings_answered": len(load.bookings), "quota_approvals_answered": len(load.quotas),
            "decisions_lost": len(decisions_lost), "lost_decisions": decisions_lost[:10], "settle_s": round(waited, 1)}


# --------------------------------------------------------------------------- main


def tokens_for(env: dict[str, str], users: list[str]) -> dict[str, str]:
    out = {}
    for user in users:
        result = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "manage.py", "create_api_token", user,
                                 "--name", "site test", "--days", "1"], cwd=ROOT, capture_output=True, text=True,
                                timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": "/root", **env})
        if result.returncode != 0:
            raise SystemExit(f"create_api_token {user}: {result.stderr[-500:]}")
        out[user] = result.stdout.strip().splitlines()[-1]
    return out


def budgets(tokens: dict[str, str]) -> None:
    """Both teams get a quota large enough that no job of the run is refused for its budget."""
    def call(user: str, path: str, body: dict):
        status, _, data = Http().call("POST", path, json.dumps(body).encode(), {
            "Authorization": f"Token {tokens[user]}", "Content-Type": "application/json"})
        return status, json.loads(data or b"null")

    for team, manager in (("vision", "bob"), ("nlp", "dave")):
        status, quota = call(manager, "/api/v1/quotas/", {"team": team, "gpu_hours": "100000.00",
                                                          "justification": "site test"})
        if status != 201:
            raise SystemExit(f"quota request for {team}: {status} {quota}")
        status, answer = call("admin", f"/api/v1/quotas/{quota['id']}/approve/", {})
        if status != 200:
            raise SystemExit(f"quota approval for {team}: {status} {answer}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", default="web1,redis,db,ctld,dbd,cut-web2,cut-db")
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    parser.add_argument("--no-browser", action="store_true", help="no Chromium client (what it costs: compare)")
    parser.add_argument("--ctld-failback", choices=("stop-backup", "handover"), default="stop-backup",
                        help="ctl1 back by docs/deploy.md's procedure, or started while ctl2 is in control")
    args = parser.parse_args()
    global CTLD_FAILBACK
    CTLD_FAILBACK = args.ctld_failback
    started = time.monotonic()
    site("wait-whole", "120")
    env = site_env()
    ha = Path("/var/lib/gpuportal-site/portal/ha-urls").read_text().strip() == "1"
    log(f"site whole; portal URLs: {'multi-host database and Sentinel' if ha else 'PLAIN (current primaries)'}")
    since = (dt.datetime.now() - dt.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S")
    tokens = tokens_for(env, ["alice", "bob", "carol", "dave", "admin"])
    budgets(tokens)
    recorder = Recorder()
    cli_env = {"PATH": "/usr/bin:/bin", "HOME": "/root", "GPUPORTAL_URL": f"http://{LB}/",
               "GPUPORTAL_TOKEN": tokens["bob"]}
    load = Load(tokens, recorder, cli_env, browser=not args.no_browser)
    load.start()
    time.sleep(args.warmup)
    baseline = recorder.window(started, time.monotonic())
    log(f"baseline: {json.dumps(baseline)}")
    results = []
    for name in [f for f in args.faults.split(",") if f]:
        results.append(run_fault(name, recorder, load))
    load.finish()
    totals = counts(load, env, since, results)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    report = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit,
              "ha_urls": ha, "load": os.getloadavg(), "baseline": baseline, "faults": results, "counts": totals,
              "client_errors": load.errors[:20], "clients_died": load.died,
              "browser": {"jobs": load.browser_jobs, "cpu_s": load.browser_cpu_s} if load.browser else None,
              "total_s": round(time.monotonic() - started, 1)}
    print(json.dumps(report, indent=2), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print("\n| fault | requests | failed | longest gap (s) | whole again (s) | jobs accepted | longest accept → Slurm id (s) "
          "| oldest Slurm sync (s) |\n|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['what']} | {r['requests']} | {r['failed']} | {r['longest_gap_s']} ({r['longest_gap_client']}) "
              f"| {r['whole_again_s']} | {r.get('jobs_accepted')} | {r.get('longest_accept_to_slurm_s')} "
              f"| {r['max_sync_age_s']} |")
    print(f"\njobs accepted {totals['jobs_accepted']}, lost {totals['jobs_lost']} (started, then unknown to Slurm: "
          f"{totals['jobs_started_then_unknown_to_slurm']}), duplicated in Slurm "
          f"{totals['jobs_duplicated_in_slurm']}, GPU-seconds counted twice {totals['gpu_seconds_counted_twice']}, "
          f"decisions lost {totals['decisions_lost']} (of {totals['bookings_answered']} bookings, "
          f"{totals['quota_approvals_answered']} quota approvals)")
    print(f"jobs Slurm ran twice under one id (requeued after a takeover; each run charged once): "
          f"{totals['jobs_run_twice_by_slurm']}")
    print("by client (accepted / lost / duplicated): " + ", ".join(
        f"{c} {t['accepted']}/{t['lost']}/{t['duplicated']}" for c, t in sorted(totals["jobs_by_client"].items())))
    if load.browser:
        print(f"the browser: {load.browser_jobs} jobs through the form, Chromium's CPU {load.browser_cpu_s} s "
              f"over {report['total_s']} s")
    if load.died:
        print(f"clients that died: {load.died} (see client_errors)")
    bad = totals["jobs_lost"] or totals["jobs_duplicated_in_slurm"] or totals["gpu_seconds_counted_twice"] \
        or totals["decisions_lost"] or any(r["whole_again_s"] is None for r in results) or load.died \
        or any(not r["runs_jobs_again"]["job_started"] or r["runs_jobs_again"]["gpus_held_by_no_job"]
               or r["runs_jobs_again"].get("portal_saw_it") is False for r in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
