"""Celery beat once across the site (issue 42): every portal host runs ``celery -A portal.project beat``,
and only the holder of the ``celery-beat`` lease sends the schedule's tasks (portal/project/celery.py).

Why a lease row in PostgreSQL: the database is the one thing every host already shares, it is the
source of truth that itself fails over (a standby promoted keeps the row), and its clock is the
one every host compares with, so no host's own clock decides. A lock on the broker's Redis would
live on the one part that loses recent writes at a failover (Sentinel promotes an asynchronous
replica), and Celery ships no leader election of its own.

How: ``LeaderScheduler`` is Celery's default ``PersistentScheduler`` (what ``beat`` runs without
``-S``) whose ``tick`` first claims the lease (portal.services.lease_claim: one conditional UPDATE,
"holder is me or the lease has expired") every BEAT_LEASE_SECONDS / 3, and runs the schedule only
while it holds it. A holder that cannot renew (its database connection is down, another took the
lease) stops sending once the lease it last confirmed may have run out: that deadline is counted
from *before* its renewal was sent, so it falls before the moment the database lets another take
the lease; two hosts never send at once. A holder SIGKILLed is replaced within BEAT_LEASE_SECONDS
plus one renewal period; one stopped cleanly (SIGTERM) gives the lease up (``close``) and is
replaced at once. The new holder's entries count from its own schedule file: what is due runs at
once on takeover (the periodic tasks are sweepers and syncs; running one early does no harm).
Selected by CELERY_BEAT_SCHEDULER in settings, so every ``celery beat`` the portal starts is leased;
nothing here knows how many hosts there are."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid

from celery.beat import PersistentScheduler

logger = logging.getLogger(__name__)

BEAT_LEASE = "celery-beat"
# Sending stops this long before the confirmed lease could run out (the send after a tick's
# decision takes milliseconds; this covers a slow one)
SAFETY_MARGIN_SECONDS = 0.5


class LeaderScheduler(PersistentScheduler):
    """Celery's PersistentScheduler, ticking only while this process holds the beat lease."""

    def __init__(self, *args, **kwargs):
        from django.conf import settings

        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_seconds = float(settings.BEAT_LEASE_SECONDS)
        self.renew_every = self.lease_seconds / 3
        self.held_until = 0.0  # time.monotonic() until which the lease is ours for sure
        self.claimed_at = float("-inf")  # time.monotonic() of the last claim attempt
        self.holding = False
        super().__init__(*args, **kwargs)

    def _claim(self) -> None:
        from django.db import DatabaseError, close_old_connections

        from portal.services import lease_claim

        sent = time.monotonic()  # before the UPDATE: the database's expiry is later than this + lease
        self.claimed_at = sent
        close_old_connections()  # a connection the database's failover killed is replaced (CONN_HEALTH_CHECKS)
        try:
            held = lease_claim(name=BEAT_LEASE, holder=self.holder, seconds=self.lease_seconds)
        except DatabaseError as exc:
            logger.warning("beat lease: not renewed (%s); sending stops when it may have run out", exc)
            return
        if held:
            self.held_until = sent + self.lease_seconds - SAFETY_MARGIN_SECONDS
        else:
            self.held_until = 0.0
        if held != self.holding:
            logger.info("beat lease %s by %s", "taken" if held else "lost", self.holder)
            self.holding = held

    def tick(self, *args, **kwargs) -> float:
        if time.monotonic() - self.claimed_at >= self.renew_every:
            self._claim()
        remaining = self.held_until - time.monotonic()
        if remaining <= 0:
            if self.holding:
                logger.warning("beat lease %s may have run out: not sending", self.holder)
                self.holding = False
            return max(0.1, self.claimed_at + self.renew_every - time.monotonic())
        return min(super().tick(*args, **kwargs), remaining, self.renew_every)

    def close(self) -> None:
        super().close()
        if self.holding:
            from django.db import DatabaseError

            from portal.services import lease_release

            try:
                lease_release(name=BEAT_LEASE, holder=self.holder)
                logger.info("beat lease released by %s", self.holder)
            except DatabaseError as exc:
                logger.warning("beat lease not released (%s); it expires", exc)
