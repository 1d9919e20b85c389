"""The idle-GPU policy's rules (issue 40 item 3): the site's bounds (settings GPU_IDLE_POLICY_*, the
admin's), which values a team's manager may set within them (``idle_policy_errors``: one message per
field out of bounds) and what a team's stored policy means now (``IdlePolicy.effective``: clamped into
the bounds in force, so a bound raised later applies at once to every team). Pure functions over the
settings: the service (portal.services.team_idle_policy_set) writes, the GPU check
(jobs.services.gpu_alerts) and the pages read."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings

FIELDS = ("threshold_percent", "warn_minutes", "cancel_minutes")


def _decimal(value: float) -> Decimal:
    return Decimal(str(value))


@dataclass(frozen=True)
class IdlePolicyBounds:
    """What the admin allows (settings): the largest threshold, the shortest warning and cancel delays,
    the longest delay."""

    max_threshold_percent: Decimal
    min_warn_minutes: Decimal
    min_cancel_minutes: Decimal
    max_minutes: Decimal

    @classmethod
    def current(cls) -> IdlePolicyBounds:
        return cls(
            max_threshold_percent=_decimal(settings.GPU_IDLE_POLICY_MAX_THRESHOLD_PERCENT),
            min_warn_minutes=_decimal(settings.GPU_IDLE_POLICY_MIN_WARN_MINUTES),
            min_cancel_minutes=_decimal(settings.GPU_IDLE_POLICY_MIN_CANCEL_MINUTES),
            max_minutes=_decimal(settings.GPU_IDLE_POLICY_MAX_MINUTES),
        )

    def as_dict(self) -> dict:
        return {"max_threshold_percent": self.max_threshold_percent, "min_warn_minutes": self.min_warn_minutes,
                "min_cancel_minutes": self.min_cancel_minutes, "max_minutes": self.max_minutes}  # fmt: skip


def _shown(value: Decimal) -> str:
    """10.00 → "10", 0.50 → "0.5" (the bounds as people write them)."""
    return f"{value.normalize():f}"


def idle_policy_errors(*, threshold_percent: Decimal, warn_minutes: Decimal, cancel_minutes: Decimal,
                       bounds: IdlePolicyBounds | None = None) -> dict[str, list[str]]:  # fmt: skip
    """The fields out of the admin's bounds, each with what is allowed ({} when all are within)."""
    b = bounds or IdlePolicyBounds.current()
    errors: dict[str, list[str]] = {}
    if not (Decimal(0) < threshold_percent <= b.max_threshold_percent):
        errors["threshold_percent"] = [f"Between 0 and {_shown(b.max_threshold_percent)} % (the site's limit)."]
    if not (b.min_warn_minutes <= warn_minutes <= b.max_minutes):
        errors["warn_minutes"] = [f"At least {_shown(b.min_warn_minutes)} and at most {_shown(b.max_minutes)} minutes (the site's limits)."]
    if not (b.min_cancel_minutes <= cancel_minutes <= b.max_minutes):
        errors["cancel_minutes"] = [f"At least {_shown(b.min_cancel_minutes)} and at most {_shown(b.max_minutes)} minutes (the site's limits)."]
    return errors


@dataclass(frozen=True)
class IdlePolicy:
    """A team's policy as it applies now: a GPU under ``threshold_percent`` is idle; all of a job's
    GPUs idle for ``warn`` warns, and ``cancel`` after the warning the job is cancelled."""

    threshold_percent: float
    warn: dt.timedelta
    cancel: dt.timedelta

    @classmethod
    def effective(cls, *, threshold_percent: Decimal, warn_minutes: Decimal, cancel_minutes: Decimal,
                  bounds: IdlePolicyBounds | None = None) -> IdlePolicy:  # fmt: skip
        """The stored values clamped into the bounds in force."""
        b = bounds or IdlePolicyBounds.current()
        threshold = min(Decimal(threshold_percent), b.max_threshold_percent)
        warn = min(max(Decimal(warn_minutes), b.min_warn_minutes), b.max_minutes)
        cancel = min(max(Decimal(cancel_minutes), b.min_cancel_minutes), b.max_minutes)
        return cls(threshold_percent=float(threshold), warn=dt.timedelta(minutes=float(warn)), cancel=dt.timedelta(minutes=float(cancel)))
