"""GET /healthz: database, broker and Slurm, as JSON; 200 when all answer, 503 naming what does not.
GET /livez: this process answers requests (200, nothing else asked): what a load balancer checks.

The web process never talks to Slurm: Slurm's health is what the workers last saw (the cluster
inventory sync runs every 30 s per cluster), and a cluster counts as down when its read failed or is
too old. With several clusters, ``checks.slurm.clusters`` has each one's state and ``checks.slurm.down``
names the clusters down; some down and some up is ``"status": "degraded"`` with 200 (the portal
still serves the others: a load balancer must not take it out), all down is 503.

Each cluster's ``accounting_rollup`` says how far its slurmdbd has rolled usage up (what sreport and
the reconciliation can know; accounting.selectors.rollup_status); a stale roll-up is a warning in
``warnings`` (the cluster still runs jobs), never a failure."""

from __future__ import annotations

from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from kombu import Connection

from accounting.selectors import rollup_status
from portal.models import SyncStatus
from portal.slurm import configured_clusters


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
        # the transport options name a sentinel:// broker's master (master_name)
        with Connection(settings.CELERY_BROKER_URL, connect_timeout=2,
                        transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS) as conn:  # fmt: skip
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=2)
        return {"ok": True}
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": str(exc)[:200]}


def _check_slurm() -> dict:
    names = [config.name for config in configured_clusters()]
    clusters = {name: _check_cluster(name) for name in names}
    down = [name for name in names if not clusters[name]["ok"]]
    result = {**clusters[names[0]], "ok": not down, "down": down, "clusters": clusters}
    if down and len(names) > 1:
        result["error"] = "; ".join(f"{name}: {clusters[name]['error']}" for name in down)
    if down and len(down) < len(names):
        result["degraded"] = True
    return result


def _check_cluster(name: str) -> dict:
    result = _check_cluster_sync(name)
    try:
        rollup = rollup_status(name)
    except Exception as exc:  # noqa: BLE001 — database down: said by the database check
        return {**result, "accounting_rollup": {"error": str(exc)[:150]}}
    result["accounting_rollup"] = rollup.as_dict()
    if rollup.stale:
        result["warnings"] = [rollup.message]
    return result


def _check_cluster_sync(name: str) -> dict:
    try:
        status = SyncStatus.objects.filter(kind=SyncStatus.kind_for("cluster", name)).first()
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
    degraded = failing == ["slurm"] and checks["slurm"].get("degraded")
    status = "ok" if not failing else "degraded" if degraded else "unavailable"
    body = {"status": status, "failing": failing, "checks": checks}
    return JsonResponse(body, status=200 if not failing or degraded else 503)


@never_cache
@require_GET
def livez(request):
    """200 as long as this process answers: no database, broker, cache or Slurm call (the middlewares
    touch none of them for a request without a session cookie). A load balancer checks this, not
    /healthz: the database, Redis and Slurm are shared by every portal host, so when one of them fails
    over every host's /healthz says 503 at once and taking them all out helps nobody — the pages that
    need none of them go down too. Each request that needs one answers 503 with Retry-After by itself
    meanwhile (portal.exceptions.backend_unavailable). /healthz stays what monitoring watches."""
    return JsonResponse({"status": "ok"})
