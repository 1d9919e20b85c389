"""Issue 30: a member (alice, team vision) tries every input she has to escape the portal's control,
and each case asserts what must happen. No case reaches Slurm (``relays`` records the enqueues);
what Slurm itself makes of the scripts is tests/security/test_adversarial_slurm.py.

Inputs: script directives in every prefix sbatch reads (``#SBATCH``, ``#SLURM``; ``#PBS`` and
``#BSUB`` only without ``--ignore-pbs``) and every way of writing them (abbreviations, quotes,
escapes, several per line, across lines, CR line ends, non-ASCII blanks and digits), paths
(workdir, --output/--error/--chdir), symlinks, FIFOs and other users' files as output, environment
names and values, array/task ids, headers (Host, X-Forwarded-For, Authorization), query parameters
and form fields (Unicode digits), the login pages, the metrics endpoint, the CSV export."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.test import Client
from rest_framework.test import APIClient

from accounting.reports import rows_to_csv
from gpuportal_sbatch.directives import begin_latest, parse_directives
from jobs.choices import JobState
from jobs.models import Job
from jobs.selectors import job_output
from portal.slurm.cli_argv import sbatch_argv
from tests.security.test_security import low_rates  # noqa: F401  (a fixture)
from tests.security.test_url_matrix import make_job
from tests.support import job_overrides, job_payload, slurm_job

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _inventory(inventory_small):
    """Partition gpu on one 4×a100 node, as the sync records it: submissions are checked against it."""


def api_as(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user=user)
    return client


def submit(world, **overrides):
    return api_as(world.alice).post("/api/v1/jobs/", job_payload(**overrides), format="json")


def script_with(*lines: str) -> str:
    return "#!/bin/bash\n" + "".join(line + "\n" for line in lines) + "echo hi\n"


# ---------------------------------------------------------------- directives: refused, however written

# Each script tries to make the job run as root, with another group, with the portal's environment,
# held, at a higher priority, in a reservation, deferred for decades, as another team, or longer
# than the portal will charge for: a 400 naming the script's line, nothing stored, nothing relayed.
REFUSED_SCRIPTS = {
    "uid": script_with("#SBATCH --uid=0"),
    "uid-slurm-prefix": script_with("#SLURM --uid=0"),
    "uid-no-space-after-prefix": script_with("#SBATCH--uid=0"),
    "uid-abbreviated": script_with("#SBATCH --ui=0"),
    "uid-quoted": script_with('#SBATCH "--uid=0"'),
    "uid-escaped": script_with("#SBATCH \\--uid=0"),
    "uid-second-on-line": script_with("#SBATCH --time=5 --uid=0"),
    "uid-value-on-next-line": script_with("#SBATCH --uid", "#SBATCH 0"),
    "uid-crlf": script_with("#SBATCH --uid=0\r"),
    "uid-after-blank-and-comments": script_with("", "# set up", "   ", "#SBATCH --uid=0"),
    "uid-tab-separated": script_with("#SBATCH\t--uid=0"),
    "uid-vertical-tab-separated": script_with("#SBATCH --time=5\v--uid=0"),
    "gid": script_with("#SBATCH --gid=0"),
    "export-all": script_with("#SBATCH --export=ALL"),
    "export-abbreviated": script_with("#SBATCH --expo=ALL"),
    "export-file": script_with("#SBATCH --export-file=/etc/environment"),
    "hold": script_with("#SBATCH --hold"),
    "hold-short": script_with("#SBATCH -H"),
    "hold-in-a-cluster": script_with("#SBATCH -vH"),
    "priority": script_with("#SBATCH --priority=4294967294"),
    "negative-nice": script_with("#SBATCH --nice=-1000"),
    "reservation": script_with("#SBATCH --reservation=maint"),
    "wrap": script_with("#SBATCH --wrap=id"),
    "begin-far": script_with("#SBATCH --begin=2099-01-01"),
    "begin-weeks": script_with("#SBATCH --begin=now+520weeks"),
    "begin-unreadable": script_with("#SBATCH --begin=12/31/99"),
    "mail-type-unknown": script_with("#SBATCH --mail-type=EVERYTHING"),
    "other-teams-account": script_with("#SBATCH --account=nlp"),
    "time-arabic-digits": script_with("#SBATCH --time=\u0663\u0660"),
    "time-superscript": script_with("#SBATCH --time=\u00b2"),
    "nodes-fullwidth-digit": script_with("#SBATCH --nodes=\uff12"),
    "ntasks-superscript": script_with("#SBATCH --ntasks=\u00b2"),
    "array-superscript": script_with("#SBATCH --array=0-\u00b2"),
    "array-throttle-superscript": script_with("#SBATCH --array=0-3%\u00b2"),
    "heterogeneous-job": script_with("#SBATCH --time=5", "#SBATCH hetjob", "#SBATCH --time=5"),
    "unknown-option": script_with("#SBATCH --bogus"),
    "unmatched-quote": script_with("#SBATCH --job-name='x"),
    "not-an-option": script_with("#SBATCH nonsense"),
    "empty-word-hides-the-rest": script_with("#SBATCH '' --uid=0"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_SCRIPTS))
def test_a_directive_the_portal_refuses_is_a_400_naming_the_script(world, relays, case):
    # no field overrides the script's time, nodes or GPUs: the directives themselves are read
    response = submit(world, script=REFUSED_SCRIPTS[case], time_limit_minutes=None, nodes=None)
    assert response.status_code == 400, (case, response.json())
    assert "script" in response.json()["errors"], response.json()
    assert Job.objects.count() == 0 and relays["relay"] == relays["drain"] == []


# Lines sbatch does NOT read: the portal must not read them either (else it validates and charges
# for a request Slurm never sees), and they must not reach Slurm in a way that it reads them.
INERT_SCRIPTS = {
    "after-the-first-command": "#!/bin/bash\necho start\n#SBATCH --uid=0\n",
    "indented": "#!/bin/bash\n  #SBATCH --uid=0\necho hi\n",
    "lower-case-prefix": "#!/bin/bash\n#sbatch --uid=0\necho hi\n",
    "nbsp-before-a-comment-ends-the-block": "#!/bin/bash\n\u00a0# comment\n#SBATCH --uid=0\necho hi\n",
    "file-separator-ends-the-block": "#!/bin/bash\n\x1c# comment\n#SBATCH --uid=0\necho hi\n",
    "byte-order-mark-first": "\ufeff#!/bin/bash\n#SBATCH --uid=0\necho hi\n",
}


@pytest.mark.parametrize("case", sorted(INERT_SCRIPTS))
def test_a_line_sbatch_does_not_read_is_not_read_by_the_portal(world, relays, case):
    script = INERT_SCRIPTS[case]
    assert [d.option for d in parse_directives(script)] == []
    response = submit(world, script=script)
    assert response.status_code == 201, (case, response.json())
    job = Job.objects.get(pk=response.json()["id"])
    assert job.script.endswith(script.replace("\r\n", "\n")) and "uid" not in {option for option, _ in job_overrides(job)}


# sbatch translates #PBS and #BSUB lines (walltime, nice, hold, queue, exclusive, output, ...)
# unless --ignore-pbs: the portal reads neither, so every sbatch it runs carries --ignore-pbs.
FOREIGN_PREFIXES = {
    "pbs-walltime": "#PBS -l walltime=99:00:00",
    "pbs-nice": "#PBS -p -1000",
    "pbs-hold": "#PBS -h",
    "pbs-output": "#PBS -o /home/bob/stolen.out",
    "pbs-array": "#PBS -J 0-999",
    "bsub-time": "#BSUB -W 6000",
    "bsub-exclusive": "#BSUB -x",
    "bsub-queue": "#BSUB -q train",
    "bsub-cwd": "#BSUB -cwd /root",
}


@pytest.mark.parametrize("case", sorted(FOREIGN_PREFIXES))
def test_pbs_and_bsub_lines_are_accepted_inert_and_sbatch_is_told_to_ignore_them(world, relays, case):
    script = script_with("#SBATCH --time=2", FOREIGN_PREFIXES[case])
    assert [(d.option, d.value) for d in parse_directives(script)] == [("time", "2")]
    response = submit(world, script=script, time_limit_minutes=None)
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert job.time_limit_minutes == 2 and not job.exclusive
    argv = sbatch_argv(slurm_job(script=script, account="vision", partition="gpu"))
    assert "--ignore-pbs" in argv and argv.index("--ignore-pbs") < len(argv)


@pytest.mark.parametrize(
    ("value", "latest_days"),
    [("now", 0), ("now+7days", 7), ("NOW + 2 hours", 1), ("now-3days", 0), ("16:00", 2), ("teatime", 2),
     ("tomorrow", 2), ("2026-12-04", None), ("2026-12-04T10:30", None), ("uts1800000000", None)],
)  # fmt: skip
def test_begin_forms_the_portal_reads(value, latest_days):
    from django.utils import timezone

    now = timezone.now()
    latest = begin_latest(value, now=now)
    if latest_days is not None:
        assert (latest - now).total_seconds() <= latest_days * 86400 + 1


def test_a_begin_within_the_bound_is_accepted_and_the_bound_is_a_setting(world, relays, settings):
    assert submit(world, script=script_with("#SBATCH --begin=now+6days")).status_code == 201
    settings.JOB_BEGIN_MAX_DAYS = 1
    response = submit(world, script=script_with("#SBATCH --begin=now+2days"))
    assert response.status_code == 400 and "JOB_BEGIN_MAX_DAYS" in response.json()["errors"]["script"][0]


@pytest.mark.parametrize("value", ["NONE", "none", "END,FAIL", "ALL", "TIME_LIMIT_80,ARRAY_TASKS", "INVALID_DEPEND"])
def test_mail_types_slurm_takes_are_accepted(world, relays, value):
    assert submit(world, script=script_with(f"#SBATCH --mail-type={value}")).status_code == 201


# ---------------------------------------------------------------- paths


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"workdir": "relative/dir"}, "workdir"),
        ({"workdir": "/tmp/a\nb"}, "workdir"),
        ({"workdir": "/tmp/%u"}, "workdir"),
        ({"workdir": "/" + "a" * 2000}, "workdir"),
        ({"script": script_with("#SBATCH --chdir=/tmp/%j")}, "script"),
        ({"name": "a b"}, "name"),
        ({"name": "x\ny"}, "name"),
        ({"name": "../../etc/passwd"}, "name"),
    ],
)
def test_a_bad_path_or_name_is_a_400_naming_its_field(world, relays, overrides, field):
    response = submit(world, **overrides)
    assert response.status_code == 400 and field in response.json()["errors"], response.json()


@pytest.fixture
def job_reading(world, tmp_path, settings):
    """A RUNNING job of alice's whose stdout is ``tmp_path/out`` and that ran as this process's uid."""
    settings.JOB_OUTPUT_PATTERN = str(tmp_path) + "/{stream}"
    job = make_job(world.vision, world.alice, state=JobState.RUNNING, slurm_job_id=4711, unix_uid=os.getuid())
    return job, tmp_path / "out"


def test_output_that_is_a_symlink_is_not_followed(job_reading, tmp_path):
    job, out = job_reading
    secret = tmp_path / "secret"
    secret.write_text("not yours")
    out.symlink_to(secret)
    chunk = job_output(job=job)
    assert chunk.data == "" and "cannot be read" in chunk.message


def test_output_that_is_a_fifo_is_refused_without_blocking(job_reading):
    job, out = job_reading
    os.mkfifo(out)
    chunk = job_output(job=job)
    assert chunk.data == "" and "not a regular file" in chunk.message


def test_output_owned_by_another_user_is_not_shown(job_reading):
    job, out = job_reading
    out.write_text("someone else's")
    os.chown(out, 4242, 4242)
    chunk = job_output(job=job)
    assert chunk.data == "" and "does not belong" in chunk.message


def test_output_of_a_job_without_a_recorded_uid_is_checked_against_its_submitters_account(job_reading, unix_users):
    """Issue 30, finding 3: a job the sync adopted had no unix_uid, and its output was read unchecked."""
    job, out = job_reading
    Job.objects.filter(pk=job.pk).update(unix_uid=None)
    job.refresh_from_db()
    out.write_text("root's file\n")  # owned by this process (root), not by alice
    chunk = job_output(job=job)
    assert chunk.data == "" and "does not belong" in chunk.message
    os.chown(out, *unix_users["alice"])
    assert job_output(job=job).data == "root's file\n"


# ---------------------------------------------------------------- environment


@pytest.mark.parametrize(
    "environment",
    [
        {"A-B": "1"}, {"1ABC": "1"}, {"": "1"}, {"X\n": "1"}, {"X Y": "1"}, {"X=Y": "1"}, {"\u00e9T\u00c9": "1"},
        {"X": "a\x00b"}, {"X": "v" * (32 * 1024 + 1)}, {f"V{i}": "1" for i in range(65)}, {"X": ["list"]},
        {"X": True}, ["not", "a", "dict"],
    ],
)  # fmt: skip
def test_a_bad_environment_is_a_400_naming_environment(world, relays, environment):
    response = submit(world, environment=environment)
    assert response.status_code == 400 and "environment" in response.json()["errors"], response.json()
    assert Job.objects.count() == 0


@pytest.mark.parametrize("value", ["$(id)", "`id`", "'; rm -rf / #", "a\nb", '"quoted"', "\\", "\u2603"])
def test_shell_looking_values_are_stored_as_given(world, relays, value):
    response = submit(world, environment={"HOSTILE": value})
    assert response.status_code == 201, response.json()
    assert Job.objects.get(pk=response.json()["id"]).environment == {"HOSTILE": value}


# ---------------------------------------------------------------- array and task ids, query parameters


@pytest.mark.parametrize("task", ["\u00b2", "\u0663", "-1", "1e3", "0x1", " 1", "", "99999999999999999999999"])
def test_a_bad_task_id_is_a_400_naming_task(world, relays, task):
    job = make_job(world.vision, world.alice, array="0-3", array_tasks=4, state=JobState.PENDING, slurm_job_id=77)
    response = api_as(world.alice).post(f"/api/v1/jobs/{job.pk}/cancel/?task={task}")
    assert response.status_code == 400 and "task" in response.json()["errors"], response.content
    job.refresh_from_db()
    assert job.cancel_requested_at is None


@pytest.mark.parametrize(
    ("query", "field"),
    [("offset=\u00b2", "offset"), ("length=\u00b2", "length"), ("offset=-1", "offset"), ("stream=../../etc", "stream"),
     ("task=\u00b2", "task")],
)  # fmt: skip
def test_bad_output_query_parameters_are_400s_naming_them(world, query, field):
    job = make_job(world.vision, world.alice)
    response = api_as(world.alice).get(f"/api/v1/jobs/{job.pk}/output/?{query}")
    assert response.status_code == 400 and field in response.json()["errors"], response.content


@pytest.mark.parametrize("template", ["\u00b2", "\u0663", "1\u00b2", "-1", "abc"])
def test_a_template_id_that_is_no_number_is_a_400_naming_template(world, client_for, template):
    response = client_for("member").get(f"/jobs/new/?template={template}")
    assert response.status_code == 400 and b"template" in response.content


@pytest.mark.parametrize("days", ["\u00b2", "\u0663", "-1", "1.5"])
def test_a_token_lifetime_that_is_no_number_is_refused_with_a_message(world, client_for, days):
    response = client_for("member").post("/account/tokens/", {"name": "t", "expires_in_days": days}, follow=True)
    assert response.status_code == 200
    assert "whole number of days" in response.content.decode() or "out of range" in response.content.decode()
    assert not world.alice.api_tokens.exists()


@pytest.mark.parametrize("query", ["page=\u00b2", "state=\u00b2", "since=\u00b2", "team=\u00b2", "ids=\u00b2"])
def test_unicode_digits_in_list_queries_never_500(world, client_for, query):
    assert client_for("member").get(f"/jobs/?{query}").status_code in (200, 400, 404)
    assert api_as(world.alice).get(f"/api/v1/jobs/?{query}").status_code in (200, 400, 404)


# ---------------------------------------------------------------- headers


def test_a_foreign_host_header_is_refused(world):
    assert Client(HTTP_HOST="evil.example").get("/login/").status_code == 400


@pytest.mark.parametrize("header", ["Token ", "Token \x00", "Token " + "x" * 5000, "Token a b", "Bearer abc", "Basic YWxpY2U6cHc="])
def test_a_forged_authorization_header_is_401(world, header):
    response = APIClient().get("/api/v1/jobs/", HTTP_AUTHORIZATION=header)
    assert response.status_code == 401


def test_x_forwarded_for_does_not_dodge_the_login_throttle(world, low_rates):  # noqa: F811
    statuses = [
        Client(HTTP_X_FORWARDED_FOR=f"203.0.113.{i}").post("/login/", {"username": "alice", "password": "x"}).status_code
        for i in range(4)
    ]
    assert statuses == [200, 200, 200, 429]


def test_the_admin_login_is_throttled_like_the_login_page(world, low_rates):  # noqa: F811
    """Issue 30, finding 5: /admin/login/ took staff passwords at any rate."""
    client = Client()
    statuses = [client.post("/admin/login/", {"username": "admin", "password": "wrong"}).status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    assert client.post("/login/", {"username": "admin", "password": "wrong"}).status_code == 429  # one counter
    assert Client(REMOTE_ADDR="10.0.0.9").post("/admin/login/", {"username": "admin", "password": "pw-for-tests"}).status_code == 302


def test_metrics_admit_no_address_by_default():
    """Issue 30, finding 4: loopback was allow-listed, and on the demo every job runs on this host."""
    code = "import django; django.setup(); from django.conf import settings; print(settings.METRICS_ALLOWED_IPS)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("METRICS_")} | {"DJANGO_SETTINGS_MODULE": "portal.project.settings"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_metrics_from_a_job_on_this_host_are_refused_without_the_token(world, settings):
    settings.METRICS_ALLOWED_IPS = []
    settings.METRICS_TOKEN = "t" * 40
    assert Client().get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403
    assert Client().get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_AUTHORIZATION="Bearer " + "t" * 40).status_code == 200


@pytest.mark.parametrize("path", ["/login/", "/", "/jobs/", "/admin/login/", "/api/docs/"])
def test_pages_carry_a_content_security_policy_with_a_fresh_nonce(world, client_for, path):
    client = client_for("admin")
    first, second = client.get(path), client.get(path)
    policy = first["Content-Security-Policy"]
    assert "script-src 'self' 'nonce-" in policy and "object-src 'none'" in policy and "frame-ancestors 'none'" in policy
    assert "'unsafe-inline'" not in policy.split("script-src", 1)[1].split(";", 1)[0]
    assert policy != second["Content-Security-Policy"]


def test_every_inline_script_carries_the_nonce(world, client_for, settings):
    """The job page with its GPU charts (shown once the job has GPU samples): every inline script
    carries the nonce. Since issue 40 the charts are drawn by a file (portal/job_detail.js, which
    redraws them when the section's poll brings new data), so the page has no inline script at all."""
    import datetime as dt

    from django.utils import timezone

    from jobs.gpu_summary import summary_encode
    from jobs.models import JobGpuSummary, JobGpuUsage

    settings.PROMETHEUS_URL = "http://127.0.0.1:9"  # GPU monitoring on: the section shows its charts
    job = make_job(world.vision, world.alice)
    now = timezone.now()
    usage = JobGpuUsage.objects.create(job=job, slurm_job_id=1, host="a100-01", gpu="0", step_seconds=15, samples=1,
                                       util_sum=50, util_peak=50, first_at=now - dt.timedelta(seconds=15), last_at=now)  # fmt: skip
    JobGpuSummary.objects.create(job=job, ended_at=now, data=summary_encode([usage], {0: [(now, 50.0, 1024.0)]}, minimum_width=15))
    response = client_for("member").get(f"/jobs/{job.pk}/")
    nonce = response["Content-Security-Policy"].split("'nonce-", 1)[1].split("'", 1)[0]
    body = response.content.decode()
    tags = [part.split(">", 1)[0] for part in body.split("<script")[1:]]
    # a data block (json_script: type="application/json") is not run, and CSP does not apply to it
    inline = [tag for tag in tags if "src=" not in tag and 'type="application/json"' not in tag]
    assert [tag for tag in inline if f'nonce="{nonce}"' not in tag] == []
    assert 'id="gpu-chart-data"' in body and "portal/job_detail.js" in body  # the charts are on the page, drawn by a file


# ---------------------------------------------------------------- the CSV export


@pytest.mark.parametrize("label", ['=HYPERLINK("http://x.example","click")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "\tx", "\rx"])
def test_csv_cells_that_a_spreadsheet_would_run_are_escaped(label):
    """Issue 30, finding 9 (OWASP: a leading = + - @ tab or CR makes a formula)."""
    text = rows_to_csv([{"group_by": "team", "key": "k", "label": label, "gpu_hours": 1, "cost": -3}])
    cells = text.splitlines()[1] if "\r" not in label else text
    assert f"'{label}" in text.replace('""', '"') and label not in cells.replace(f"'{label}", "")
    assert ",-3," in text  # numbers stay numbers, negative ones too
