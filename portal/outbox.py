"""The outbox: enqueue work for rows the current transaction writes, once it commits. One policy.

The row is the truth and the task only carries its id: a broker that does not answer is logged
and swallowed, never turned into an error for a client whose row is committed. Each kind of work
enqueued here has a periodic sweeper (portal/celery.py) that finds the rows still waiting and
enqueues them again: jobs.tasks.jobs_sweep_task (relays, cancels), accounting.tasks.booking_cleanup_task
(reservations), quota_rollover_task (quota limits), portal.tasks.team_mirror_sweep_task (teams),
budget_alert_sweep_task (alert e-mails). Two kinds have none yet: re-pricing after a new rate (no row records that
it was done: a sweeper needs one) and job-end e-mails (a lost notice is not re-sent; the job page
shows the end)."""

from __future__ import annotations

import logging

from django.db import transaction
from kombu.exceptions import OperationalError as BrokerError

logger = logging.getLogger(__name__)


def publish(task, *args) -> bool:
    """``task.delay(*args)`` now; False (logged) when the broker does not answer."""
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
