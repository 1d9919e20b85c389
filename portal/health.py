"""GET /healthz: database, broker and Slurm, as JSON; 200 when all answer, 503 naming what does not.

The web process never talks to Slurm: Slurm's health is what the workers last saw (the cluster
inventory sync runs every 30 s), and it counts as down when that read failed or is too old."""

from __future__ import annotations

from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from kombu import Connection

from portal.models import SyncStatus


def _check_database() -> dict:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        return {"ok": True}
    except Exception as exc:  # noqa: BLE001 — any failure means unhealthy
        return {"ok": False, "error": str(exc)[:200]}


def _check_broker() -> dict:
    try:
        with Connection(settings.CELERY_BROKER_URL, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=2)
        return {"ok": True}
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": str(exc)[:200]}


def _check_slurm() -> dict:
    try:
        status = SyncStatus.objects.filter(kind="cluster").first()
    except Exception as exc:  # noqa: BLE001 — database down: we cannot know
        return {"ok": False, "error": f"unknown: {str(exc)[:150]}"}
    if status is None or status.last_success_at is None:
        return {"ok": False, "error": "no successful read of the cluster yet"}
    age = (timezone.now() - status.last_success_at).total_seconds()
    result = {"last_success_at": status.last_success_at.isoformat(), "age_seconds": round(age, 1)}
    if status.failing_since is not None:
        return {"ok": False, "error": status.last_error[:200], "failing_since": status.failing_since.isoformat(), **result}
    if age > settings.SLURM_HEALTH_MAX_AGE:
        return {"ok": False, "error": f"last successful read {int(age)} s ago", **result}
    return {"ok": True, **result}


@never_cache
@require_GET
def healthz(request):
    checks = {"database": _check_database(), "broker": _check_broker(), "slurm": _check_slurm()}
    failing = [name for name, result in checks.items() if not result["ok"]]
    body = {"status": "ok" if not failing else "unavailable", "failing": failing, "checks": checks}
    return JsonResponse(body, status=200 if not failing else 503)
