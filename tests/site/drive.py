#!/usr/bin/env python3
"""`make test-site`: each host of the site (scripts/site, issue 42) killed in turn under load, and what
was lost counted. Not a pytest test (it needs the whole site, ~5 min): run after `scripts/site up`.

    .venv/bin/python tests/site/drive.py [--faults web1,redis,db,ctld,cut-web2,cut-db] [--json FILE]

Clients run through the load balancer the whole time, each in its own thread:
  api-alice, api-carol  the REST API with an API token: POST a job (an Idempotency-Key, the same key
                        again after a failure, as a careful script does), GET it, cancel every third;
  cli-bob               `gpuportal submit` (the CLI retries a keyed POST by itself), one job a time;
  form-dave             the browser's job form as a plain HTTP session (login, GET /jobs/new/, POST with
                        the CSRF token and the form's hidden idempotency key, again after a failure:
                        what a browser's resubmit does) — not Chromium: a page's own JavaScript is not
                        what fails over here, and a browser costs a core for minutes;
  decide-bob/admin      bookings by bob (auto-approved) and quota requests approved by admin: decisions
                        whose answer the client saw must all be in the database afterwards.
Meanwhile the site's Celery beat runs the job sync, the sweeper and the usage ingestion as usual.

Faults, in turn (`scripts/site kill HOST`: SIGKILL of every process of the host's namespace; `cut`:
its link down), each host started again (or its link mended) once the site has moved on:
  web1   a portal host                        redis  the Redis master (as Sentinel names it)
  db     the PostgreSQL primary (as the pg_auto_failover monitor names it)
  ctld   the primary slurmctld (ctl1)         cut-web2  web2's link cut for 8 s, then mended
  cut-db the PostgreSQL primary's link cut until the standby is promoted, then mended
For each: requests failed (attempts of every client between the fault and the site whole again), the
longest gap a client saw between two answers, the time until `scripts/site wait-whole` passed.
At the end, the counts: jobs lost (accepted, not cancelled before relay, no Slurm id / not in Slurm by
its tag, read again until the jobs sync has re-sent what a controller lost), apart from them the jobs
the portal saw start that Slurm then forgot (a controller killed before its state save), jobs duplicated in Slurm (a tag `gpuportal:<uuid>` on more than one Slurm job), GPU-seconds
counted twice (usage records of a job beyond one, or their sum above sacct's GPUs × elapsed), decisions
lost (an answered booking or quota approval missing from the database). Exit 1 when any is not 0."""

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
SITE = [str(ROOT / "scripts" / "site")]
PASSWORD = os.environ.get("DEMO_PASSWORD", "gpuportal-demo")
TAG = "gpuportal:"
SCRIPT = "#!/bin/bash\ntrue\n"
LB = "10.77.0.10"
LOST_WAIT = 150.0  # JOB_LOST_AFTER_SECONDS (60) and a few job syncs, on a loaded machine


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
        gap, gap_client = 0.0, ""
        for client in sorted({a[0] for a in attempts}):
            ends = sorted(a[2] for a in attempts if a[0] == client and a[3])
            for before, after in zip(ends, ends[1:]):
                if after >= start and before <= end and after - before > gap:
                    gap, gap_client = after - before, client
        kinds: dict[str, int] = {}
        for a in failed:
            kinds[a[4]] = kinds.get(a[4], 0) + 1
        return {"requests": len(inside), "failed": len(failed), "failed_by": kinds,
                "longest_gap_s": round(gap, 1), "longest_gap_client": gap_client}


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
    def __init__(self, tokens: dict[str, str], recorder: Recorder, cli_env: dict[str, str]):
        self.tokens, self.rec, self.cli_env = tokens, recorder, cli_env
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
            except (OSError, ValueError, KeyError):
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
                             ("decide", self.decisions), ("sync-age", self.sync_ages)):
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
                self.rec.add("cli-bob", started, ok, f"gpuportal submit: exit {result.returncode}")
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
            time.sleep(10)  # SlurmctldTimeout (6 s) and the backup's takeover
            site("start", h)
        return "SIGKILL every process of the primary slurmctld's host ctl1", "ctl1", back
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
    whole_ok = subprocess.run(SITE + ["wait-whole", "150"], capture_output=True, text=True).returncode == 0
    whole = time.monotonic() - t0
    time.sleep(3)
    figures = {"fault": name, "what": what, "host": host, "whole_again_s": round(whole, 1) if whole_ok else None,
               "wall": [wall0, time.time()],
               **recorder.window(t0, time.monotonic()), "max_sync_age_s": load.max_sync_age(t0, time.monotonic())}
    log(f"fault {name}: {json.dumps(figures)}")
    return figures


# --------------------------------------------------------------------------- the counts


def slurm_view(since: str, slurm_ids: list[int]) -> tuple[dict[str, list[str]], dict[str, int], dict[str, str], set[str]]:
    """What Slurm holds: {portal job id: [Slurm job ids carrying its tag]}, {Slurm id: GPU-seconds} and
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
        job_rows = {str(r[0]): {"state": r[1], "slurm_job_id": r[2], "created": r[3].timestamp(),
                                "submitted": r[4].timestamp() if r[4] else None, "started": r[5] is not None}
                    for r in conn.execute("select id, state, slurm_job_id, created_at, submitted_at, started_at "
                                          "from jobs_job where id = any(%s)", [jobs])}
        usage = [(str(r[0]), str(r[1]), r[2]) for r in conn.execute(
            "select portal_job_uuid, job_id, gpu_seconds from accounting_usagerecord where portal_job_uuid = any(%s)",
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
    records: dict[str, list] = {}
    for job, slurm_id, seconds in rows["usage"]:
        records.setdefault(job, []).append((slurm_id, seconds))
    twice = 0
    for job, recs in records.items():
        if len(recs) > 1:
            twice += sum(s for _, s in recs[1:])
        for slurm_id, seconds in recs:
            twice += max(0, seconds - gpu_seconds.get(slurm_id, seconds))
    # a decision the client was told of is lost when its row is gone or back to "requested" (an approved
    # quota may since be superseded by a later approval, a booking cancelled by its cleanup: both decided)
    decisions_lost = [b for b in load.bookings if rows["bookings"].get(b, "requested") == "requested"
                      and load.bookings[b] != "requested"] + [b for b in load.bookings if b not in rows["bookings"]] + \
        [q for q in load.quotas if rows["quotas"].get(q, "requested") == "requested"]
    return {"jobs_accepted": len(ids), "jobs_cancelled_by_clients": sum(1 for j in jobs.values() if j["cancelled"]),
            "jobs_in_slurm": sum(1 for j in ids if in_slurm(j)), "jobs_lost": len(lost),
            "jobs_started_then_unknown_to_slurm": len(unrecorded), "lost": lost_detail[:10],
            "jobs_duplicated_in_slurm": len(duplicated), "duplicated": dict(list(duplicated.items())[:10]),
            "usage_records": len(rows["usage"]), "gpu_seconds_counted_twice": twice,
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
    parser.add_argument("--faults", default="web1,redis,db,ctld,cut-web2,cut-db")
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
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
    load = Load(tokens, recorder, cli_env)
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
              "client_errors": load.errors[:20], "total_s": round(time.monotonic() - started, 1)}
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
    bad = totals["jobs_lost"] or totals["jobs_duplicated_in_slurm"] or totals["gpu_seconds_counted_twice"] \
        or totals["decisions_lost"] or any(r["whole_again_s"] is None for r in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
