"""Django's PostgreSQL backend, with a health check of persistent connections that costs no round trip.

With CONN_HEALTH_CHECKS Django runs ``SELECT 1`` before the first query of every request on a
persistent connection: a round trip, and 0.35 ms of the web process's CPU per single-job POST on a
2-core machine (3.3 % of gunicorn's time, py-spy; bench/results.md). A connection the server ended
— a restart, pg_terminate_backend, idle_session_timeout, a pooler closing it — has something to read
on its socket while it is idle: the server's FATAL message, or the end of the stream. So: nothing to
read on an open connection, it is taken as healthy; anything to read, or no socket, and Django's
``SELECT 1`` decides as before (then the connection is closed and the next query opens another).
What neither check sees in time is a peer gone without a word (a cable cut): the first query then
waits for TCP, as ``SELECT 1`` would have."""

from __future__ import annotations

import select

from django.db.backends.postgresql import base
from psycopg.pq import TransactionStatus


class DatabaseWrapper(base.DatabaseWrapper):
    def close_if_health_check_failed(self):
        if (
            self.connection is not None
            and self.health_check_enabled
            and not self.health_check_done
            and not self.pool
            and idle_and_quiet(self.connection)
        ):
            self.health_check_done = True
            return
        super().close_if_health_check_failed()


def idle_and_quiet(connection) -> bool:
    """True when the psycopg ``connection`` is open, outside a transaction, and the server has sent
    nothing since its last answer (its socket has nothing to read, polled without waiting)."""
    try:
        if connection.closed or connection.broken:
            return False
        if connection.info.transaction_status != TransactionStatus.IDLE:
            return False
        poller = select.poll()
        poller.register(connection.fileno(), select.POLLIN | select.POLLPRI)
        return not poller.poll(0)
    except Exception:  # noqa: BLE001 — no answer here is an answer: SELECT 1 decides
        return False
