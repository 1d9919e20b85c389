"""Mail leaves the host: the EMAIL_* settings (password also from EMAIL_HOST_PASSWORD_FILE) deliver
the budget alerts and job-end emails to a real SMTP server (aiosmtpd, started by each test), with
SMTP AUTH checked by the server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult
from django.utils import timezone

from accounting import services as accounting_services
from jobs.choices import JobState
from jobs.services import _apply_plan
from portal.models import Profile
from tests.accounting.test_quotas import quota, used
from tests.security.test_url_matrix import make_job

ROOT = Path(__file__).resolve().parents[2]
USER, PASSWORD = "portal-mailer", "s3cret pass-word "  # ends in a space: secrets are not stripped


class _Inbox:
    def __init__(self):
        self.messages: list[tuple[str, list[str], EmailMessage]] = []
        self.logins: list[str] = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append((envelope.mail_from, list(envelope.rcpt_tos), message_from_bytes(envelope.content, policy=policy.default)))
        return "250 OK"

    def authenticate(self, server, session, envelope, mechanism, auth_data):
        ok = auth_data.login == USER.encode() and auth_data.password == PASSWORD.encode()
        if ok:
            self.logins.append(auth_data.login.decode())
        return AuthResult(success=ok)


@pytest.fixture
def smtp_server():
    inbox = _Inbox()
    with socket.socket() as probe:  # aiosmtpd's Controller cannot report the port of port=0
        probe.bind(("127.0.0.1", 0))
        inbox.port = probe.getsockname()[1]
    controller = Controller(inbox, hostname="127.0.0.1", port=inbox.port, authenticator=inbox.authenticate,
                            auth_required=True, auth_require_tls=False)  # fmt: skip
    controller.start()
    yield inbox
    controller.stop()


@pytest.fixture
def smtp_settings(settings, smtp_server):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp_server.port
    settings.EMAIL_HOST_USER, settings.EMAIL_HOST_PASSWORD = USER, PASSWORD
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.DEFAULT_FROM_EMAIL = "GPU portal <gpuportal@cluster.example.org>"
    return smtp_server


pytestmark = pytest.mark.django_db


def test_a_budget_alert_reaches_the_smtp_server(world, smtp_settings, django_capture_on_commit_callbacks):
    quota(world.vision, 10)
    used(hours=1, gpus=8)  # 8 of 10: the 80 % alert
    with django_capture_on_commit_callbacks(execute=True):
        assert [a.threshold for a in accounting_services.budget_alerts_check()] == [80]
    assert smtp_settings.logins == [USER]
    [(sender, recipients, message)] = smtp_settings.messages
    assert (sender, recipients) == ("gpuportal@cluster.example.org", ["bob@example.org"])
    assert message["From"] == "GPU portal <gpuportal@cluster.example.org>"
    assert "vision reached 80%" in message["Subject"]


def test_a_job_end_email_reaches_the_smtp_server(world, smtp_settings, django_capture_on_commit_callbacks):
    Profile.objects.filter(user=world.alice).update(notify_job_end=True)
    job = make_job(world.vision, world.alice, state=JobState.RUNNING, slurm_job_id=5151, name="train-smtp")
    now = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        _apply_plan({job.pk: {"state": JobState.COMPLETED, "exit_code": 0, "ended_at": now}}, now)
    [(sender, recipients, message)] = smtp_settings.messages
    assert recipients == [world.alice.email]
    assert message["Subject"] == "[gpuportal] train-smtp: COMPLETED"
    assert "Slurm job 5151" in message.get_content()


def _send_from_a_fresh_process(env: dict[str, str]) -> subprocess.CompletedProcess:
    code = (
        "import django; django.setup()\n"
        "from django.core.mail import send_mail\n"
        "send_mail('from settings', 'body', None, ['ops@example.org'])\n"
    )
    drop = {"EMAIL_BACKEND", "EMAIL_HOST_PASSWORD", "EMAIL_HOST_PASSWORD_FILE"}
    environ = {k: v for k, v in os.environ.items() if k not in drop} | {"DJANGO_SETTINGS_MODULE": "portal.project.settings"} | env
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60)


def test_the_environment_configures_smtp_with_the_password_from_a_file(smtp_server, tmp_path):
    secret = tmp_path / "smtp-password"
    secret.write_text(PASSWORD + "\n")  # one trailing newline (as `echo` writes it) is not part of it
    result = _send_from_a_fresh_process({
        "EMAIL_HOST": "127.0.0.1", "EMAIL_PORT": str(smtp_server.port), "EMAIL_HOST_USER": USER,
        "EMAIL_HOST_PASSWORD_FILE": str(secret), "DEFAULT_FROM_EMAIL": "portal@cluster.example.org",
    })  # fmt: skip
    assert result.returncode == 0, result.stderr
    [(sender, recipients, message)] = smtp_server.messages
    assert (sender, recipients, message["Subject"]) == ("portal@cluster.example.org", ["ops@example.org"], "from settings")
    assert smtp_server.logins == [USER]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"EMAIL_USE_TLS": "1", "EMAIL_USE_SSL": "1"}, "EMAIL_USE_TLS and EMAIL_USE_SSL are both on"),
        ({"EMAIL_HOST_PASSWORD": "x", "EMAIL_HOST_PASSWORD_FILE": "/etc/hostname"}, "both set"),
        ({"EMAIL_HOST_PASSWORD_FILE": "/nonexistent/secret"}, "EMAIL_HOST_PASSWORD_FILE='/nonexistent/secret' is invalid"),
        ({"EMAIL_PORT": "0"}, "EMAIL_PORT='0' is invalid"),
    ],
)
def test_bad_mail_settings_stop_start_up(env, message):
    result = _send_from_a_fresh_process({"EMAIL_HOST": "127.0.0.1"} | env)
    assert result.returncode != 0
    assert message in result.stderr and "ImproperlyConfigured" in result.stderr
