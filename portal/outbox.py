"""The outbox: enqueue work for rows the current transaction writes, once it commits. One policy.

The row is the truth and the task only carries its id: a broker that does not answer is logged
and swallowed, never turned into an error for a client whose row is committed. Each kind of work
enqueued here has a periodic sweeper (portal/project/celery.py) that finds the rows still waiting and
enqueues them again: jobs.tasks.jobs_sweep_task (relays, cancels), accounting.tasks.booking_cleanup_task
(reservations), quota_rollover_task (quota limits), portal.tasks.team_mirror_sweep_task (teams),
budget_alert_sweep_task (alert e-mails), budget_alert_webhook_sweep_task (alert webhooks:
BudgetAlert.webhook_claimed_at), usage_reprice_sweep_task (re-pricing after a new rate: a
PendingReprice row), jobs.tasks.job_end_notify_sweep_task (job-end e-mails: Job.end_notified_at).
Work that sends something claims its row before sending (a marker set by one conditional update), so
a sweep's repeat never sends twice.

``after_commit`` for work a transaction's rows call for; ``publish`` (the same policy, at once) where
no transaction writes them: a task handing work on, a sweeper. Nothing else in the apps calls
``.delay`` / ``.apply_async`` / ``send_task`` (tests/portal/test_outbox.py scans for them).

Coalesced work (``after_commit_coalesced``): a task that reads every row waiting (the relay drain,
jobs.tasks.job_relay_drain) needs one run for a burst of rows, not one per row. A short-lived flag on
the broker's own Redis (``SET NX EX``: it lives and dies with the messages it stands for) says "a
run is pending or running and will look again before it ends"; only the commit that sets it publishes. The run holds the flag while it works and clears it
(``coalesced_done``) before its last look, so a row committed while the flag was up is seen by that
look, and one committed after it publishes a new run. A run that dies leaves the flag to expire
(``ttl``); a flag store that does not answer, or a broker that is not Redis, publishes anyway (a
run too many is harmless, one too few waits for the sweeper)."""

from __future__ import annotations

import importlib
import logging

import redis
from django.db import transaction
from kombu.exceptions import OperationalError as BrokerError
from redis.exceptions import RedisError

from portal.redis_client import redis_client

logger = logging.getLogger(__name__)


def task_named(task):
    """A task given as itself or by its name (``"jobs.tasks.job_cancel_relay"``), as Celery's task
    registry (``app.tasks``) holds it. Services name the tasks they enqueue: a tasks module imports
    its app's services, never the other way (one direction; tests/portal/test_layers.py)."""
    if isinstance(task, str):
        from celery import current_app

        importlib.import_module(task.rpartition(".")[0])  # its module registers it (at once when imported already)
        return current_app.tasks[task]
    return task


def publish(task, *args) -> bool:
    """``task.delay(*args)`` now (``task``: a task or its name); False (logged) when the broker does
    not answer."""
    task = task_named(task)
    try:
        task.delay(*args)
    except BrokerError as exc:
        logger.warning("%s%r not enqueued (broker unavailable: %s); its sweeper will retry", task.name, args, exc)
        return False
    return True


def after_commit(task, *args) -> None:
    """Enqueue ``task.delay(*args)`` when the current transaction commits (at once outside one).
    The arguments are ids (and plain values): the task reads the rows it needs."""
    transaction.on_commit(lambda: publish(task, *args))


_flag_clients: dict[tuple[str, str | None], redis.Redis] = {}


def _flags() -> redis.Redis | None:
    """Where coalescing flags live: the broker's own Redis, so that a flag lives and dies with the
    messages it stands for (a broker restarted empty loses both); with a Sentinel URL, its master
    wherever it is now (portal.redis_client). None for a broker that is not Redis."""
    from celery import current_app as app

    url = app.conf.broker_url or ""
    if not url.startswith(("redis://", "rediss://", "sentinel://")):
        return None
    options = app.conf.broker_transport_options or {}  # the broker's own master and Sentinels
    master_name = options.get("master_name")
    client = _flag_clients.get((url, master_name))
    if client is None:
        client = _flag_clients[url, master_name] = redis_client(
            url, master_name=master_name, sentinel_options=options.get("sentinel_kwargs"),
            socket_timeout=2, socket_connect_timeout=2,
        )  # fmt: skip
    return client


def coalesced_signal(task, *, key: str, ttl: float) -> bool:
    """``task.delay()`` now unless a run is already pending or running (``key`` held); True when
    this call published. See the module docstring."""
    task = task_named(task)
    flags = _flags()
    try:
        if flags is not None and not flags.set(key, "1", nx=True, ex=max(1, round(ttl))):
            return False
    except RedisError as exc:  # the broker's Redis does not answer: publish (and log) as without a flag
        logger.warning("%s: coalescing flag %s not set (%s); publishing", task.name, key, exc)
        return publish(task)
    if publish(task):
        return True
    coalesced_done(key)  # nothing was queued: let the next commit try again
    return False


def coalesced_hold(key: str, ttl: float) -> None:
    """Keep ``key`` up for another ``ttl`` seconds (a run that is still working)."""
    flags = _flags()
    try:
        if flags is not None:
            flags.set(key, "1", ex=max(1, round(ttl)))
    except RedisError as exc:
        logger.warning("coalescing flag %s not refreshed (%s)", key, exc)


def coalesced_done(key: str) -> None:
    """Clear ``key``: the next commit publishes a new run. The caller looks once more afterwards."""
    flags = _flags()
    try:
        if flags is not None:
            flags.delete(key)
    except RedisError as exc:
        logger.warning("coalescing flag %s not cleared (%s); it expires", key, exc)


def after_commit_coalesced(task, *, key: str, ttl: float) -> None:
    """``coalesced_signal(task, key=key, ttl=ttl)`` when the current transaction commits (at once
    outside one): a burst of commits publishes about one run of ``task``, which takes no arguments
    and reads the rows that are waiting."""
    transaction.on_commit(lambda: coalesced_signal(task, key=key, ttl=ttl))
