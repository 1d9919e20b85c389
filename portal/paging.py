"""Keyset (cursor) pagination: a page is the rows after (or before) the last (first) row shown, in
the order of one column and then the primary key, so that the 10 000th page costs what the first
does (OFFSET reads and throws away every row before it: issue 39). No total count either: counting
every visible row is a cost that grows with the history. Used by the job list page and
``GET /api/v1/jobs/`` (jobs.views, jobs.apis).

A cursor is opaque to clients: base64url of ``[direction, value, pk]``, ``direction`` "n" (the rows
after that row: the next page) or "p" (the rows before it: the previous page). The order is PostgreSQL's
for the column: NULL sorts as the largest value (first when descending, last when ascending)."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db.models import F, Q, QuerySet

from portal.exceptions import ApplicationError

NEXT, PREVIOUS = "n", "p"


@dataclass(frozen=True)
class KeysetPage:
    rows: list
    next_cursor: str | None
    previous_cursor: str | None


def _encode(direction: str, value, pk) -> str:
    if isinstance(value, dt.datetime | dt.date):
        value = value.isoformat()
    raw = json.dumps([direction, value, str(pk)], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(queryset: QuerySet, field: str, cursor: str) -> tuple[str, object, object]:
    """(direction, column value, pk) of a cursor for this queryset's model; 400 when it is not one."""
    model = queryset.model
    try:
        direction, value, pk = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if direction not in (NEXT, PREVIOUS):
            raise ValueError(direction)
        column = model._meta.get_field(field)
        value = None if value is None else column.to_python(value)
        if isinstance(value, dt.datetime) and value.tzinfo is None:
            raise ValueError(value)
        return direction, value, model._meta.pk.to_python(pk)
    except (ValueError, TypeError, binascii.Error, ValidationError, UnicodeDecodeError):
        raise ApplicationError("That page link is not valid (or no longer is).",
                               errors={"cursor": ["Invalid cursor."]}) from None  # fmt: skip


def _beyond(field: str, nullable: bool, value, pk, *, downward: bool) -> Q:
    """The rows past (``value``, ``pk``) walking the order downward (from large to small) or upward,
    NULL being the largest value."""
    if downward:
        if value is None:
            return Q(**{f"{field}__isnull": True, "pk__lt": pk}) | Q(**{f"{field}__isnull": False})
        # "<= value" first: the bound an index on the column starts its scan at
        return Q(**{f"{field}__lte": value}) & (Q(**{f"{field}__lt": value}) | Q(pk__lt=pk))
    if value is None:
        return Q(**{f"{field}__isnull": True, "pk__gt": pk})
    after = Q(**{f"{field}__gte": value}) & (Q(**{f"{field}__gt": value}) | Q(pk__gt=pk))
    return after | Q(**{f"{field}__isnull": True}) if nullable else after


def _ordered(queryset: QuerySet, field: str, *, downward: bool) -> QuerySet:
    if downward:
        return queryset.order_by(F(field).desc(), F("pk").desc())
    return queryset.order_by(F(field).asc(), F("pk").asc())


def cursor_after(row, field: str) -> str:
    """The cursor of the page that follows ``row`` in an order by ``field``: what a client holds
    after paging down to it (the bench's deep pages start from one)."""
    return _encode(NEXT, getattr(row, field), row.pk)


def keyset_page(
    queryset: QuerySet, *, field: str, descending: bool, cursor: str | None, size: int
) -> KeysetPage:
    """One page of ``size`` rows of ``queryset`` ordered by ``field`` (then the primary key), from
    ``cursor`` (None: the first page). One query (``size`` + 1 rows: whether there is a page past it)."""
    nullable = queryset.model._meta.get_field(field).null
    direction, value, pk = _decode(queryset, field, cursor) if cursor else (NEXT, None, None)
    forward = direction == NEXT
    downward = descending if forward else not descending
    rows = _ordered(queryset, field, downward=downward)
    if cursor:
        rows = rows.filter(_beyond(field, nullable, value, pk, downward=downward))
    rows = list(rows[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    if not forward:
        rows.reverse()
    if not rows:
        return KeysetPage(rows=[], next_cursor=None, previous_cursor=None)
    first, last = rows[0], rows[-1]
    has_next = more if forward else True
    has_previous = bool(cursor) if forward else more
    return KeysetPage(
        rows=rows,
        next_cursor=cursor_after(last, field) if has_next else None,
        previous_cursor=_encode(PREVIOUS, getattr(first, field), first.pk) if has_previous else None,
    )
