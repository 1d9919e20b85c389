"""Database helpers the ORM lacks."""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from django.db import connections, transaction
from django.db.models import Model, QuerySet
from django.db.models.expressions import RawSQL


def copied_fields(source: object, names: Iterable[str]) -> dict[str, Any]:
    """``{name: source.name}`` for each of ``names``: the fields a row takes unchanged from another
    object (a gateway's typed result, the row it is cut from), as keyword arguments; the same names
    can then be a bulk upsert's ``update_fields``."""
    return {name: getattr(source, name) for name in names}


def bulk_update_values(queryset: QuerySet, objs: Sequence[Model], fields: Sequence[str], *, batch_size: int = 1000) -> int:
    """Write ``fields`` of ``objs`` (instances with their primary key) with ONE statement per batch,
    ``UPDATE t SET f = v.f, … FROM (VALUES (…), …) AS v WHERE t.pk = v.pk``, and return how many
    rows were written.

    What ``QuerySet.bulk_update`` does, without its ``CASE WHEN pk = … THEN …`` per row and field,
    which Django builds and compiles in Python: for 50 jobs × 10 fields that was 86 % of the batched
    relay's own time (3.7 of 4.3 ms per job, bench/bench_relay.py). Only rows that ``queryset``
    selects are written: its WHERE applies as a semi-join on the primary key, so a row that stopped
    matching (a job that ended or was claimed by another run meanwhile) is left alone — as
    ``queryset.bulk_update`` would. Elsewhere than PostgreSQL (the demo's SQLite) it is
    ``queryset.bulk_update``."""
    if not objs:
        return 0
    connection = connections[queryset.db]
    if connection.vendor != "postgresql":
        return queryset.bulk_update(objs, list(fields), batch_size=batch_size)
    meta = queryset.model._meta
    pk = meta.pk
    columns = []
    for name in fields:
        field = meta.get_field(name)
        if not field.concrete or field.many_to_many or field.primary_key:
            raise ValueError(f"bulk_update_values: {name!r} is not a concrete, non-key field of {meta.label}")
        columns.append(field)
    qn = connection.ops.quote_name
    table = qn(meta.db_table)
    row = "(" + ", ".join(f"%s::{field.cast_db_type(connection)}" for field in [pk, *columns]) + ")"
    names = ", ".join(qn(field.column) for field in [pk, *columns])
    assignments = ", ".join(f"{qn(field.column)} = v.{qn(field.column)}" for field in columns)
    written = 0
    for start in range(0, len(objs), batch_size):
        batch = objs[start : start + batch_size]
        params: list = []
        for obj in batch:
            params.append(pk.get_db_prep_save(obj.pk, connection))
            params.extend(field.get_db_prep_save(getattr(obj, field.attname), connection) for field in columns)
        keys = queryset.filter(pk__in=[obj.pk for obj in batch]).values("pk")
        sub_sql, sub_params = keys.query.get_compiler(using=queryset.db).as_sql()
        sql = (
            f"UPDATE {table} SET {assignments} FROM (VALUES {', '.join([row] * len(batch))}) AS v({names}) "
            f"WHERE {table}.{qn(pk.column)} = v.{qn(pk.column)} AND {table}.{qn(pk.column)} IN ({sub_sql})"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, *sub_params])
            written += cursor.rowcount
    return written


def bulk_insert_copy(objs: Sequence[Model], *, using: str = "default") -> int:
    """Insert new rows of one model with ``COPY … FROM STDIN`` and return how many: what
    ``bulk_create`` does for rows whose database-generated ids nobody needs back, without one INSERT
    holding a placeholder per value that Django compiles and psycopg binds (for usage slices that was
    two thirds of the ingestion's time; bench/bench_reports.py). Values go through the fields'
    ``pre_save`` (auto_now_add) and ``get_db_prep_save`` as in ``bulk_create``; a primary key the
    database generates (AutoField) is left to its sequence. Elsewhere than PostgreSQL it is
    ``bulk_create``."""
    if not objs:
        return 0
    model = type(objs[0])
    connection = connections[using]
    if connection.vendor != "postgresql":
        model._default_manager.using(using).bulk_create(objs, batch_size=1000)
        return len(objs)
    fields = [field for field in model._meta.concrete_fields if not field.db_returning]
    qn = connection.ops.quote_name
    sql = f"COPY {qn(model._meta.db_table)} ({', '.join(qn(field.column) for field in fields)}) FROM STDIN"
    with connection.cursor() as cursor:
        with cursor.cursor.copy(sql) as copy:
            for obj in objs:
                copy.write_row([field.get_db_prep_save(field.pre_save(obj, add=True), connection) for field in fields])
    return len(objs)


def bulk_upsert_copy(
    objs: Sequence[Model], *, unique_fields: Sequence[str], update_fields: Sequence[str], using: str = "default"
) -> None:
    """Insert or update rows of one model by a unique key, setting each object's primary key: what
    ``bulk_create(update_conflicts=True, unique_fields=…, update_fields=…)`` does, as ``COPY`` into a
    temporary table and one ``INSERT … SELECT … ON CONFLICT (…) DO UPDATE … RETURNING``. Objects must
    not repeat a key (PostgreSQL refuses to update a row twice in one statement; so does
    bulk_create). Elsewhere than PostgreSQL it is ``bulk_create``."""
    if not objs:
        return
    model = type(objs[0])
    connection = connections[using]
    meta = model._meta
    if connection.vendor != "postgresql":
        manager = model._default_manager.using(using)
        manager.bulk_create(
            objs, batch_size=1000, update_conflicts=True, unique_fields=list(unique_fields), update_fields=list(update_fields)
        )
        missing = [obj for obj in objs if obj.pk is None]  # backends that return no ids from an upsert
        if missing:
            names = [meta.get_field(name).attname for name in unique_fields]
            found = manager.filter(**{f"{names[0]}__in": {getattr(obj, names[0]) for obj in missing}}).values_list("pk", *names)
            ids = {tuple(key): pk for pk, *key in found}
            for obj in missing:
                obj.pk = ids[tuple(getattr(obj, name) for name in names)]
        return
    qn = connection.ops.quote_name
    fields = [field for field in meta.concrete_fields if not field.db_returning]
    keys = [meta.get_field(name) for name in unique_fields]
    updates = [meta.get_field(name) for name in update_fields]
    columns = ", ".join(qn(field.column) for field in fields)
    table, temp = qn(meta.db_table), qn(f"upsert_{meta.db_table}")
    with transaction.atomic(using=using), connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {temp}")
        cursor.execute(f"CREATE TEMPORARY TABLE {temp} AS SELECT {columns} FROM {table} WITH NO DATA")
        with cursor.cursor.copy(f"COPY {temp} ({columns}) FROM STDIN") as copy:
            for obj in objs:
                copy.write_row([field.get_db_prep_save(field.pre_save(obj, add=True), connection) for field in fields])
        cursor.execute(
            f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {temp} "
            f"ON CONFLICT ({', '.join(qn(field.column) for field in keys)}) DO UPDATE SET "
            + ", ".join(f"{qn(field.column)} = EXCLUDED.{qn(field.column)}" for field in updates)
            + f" RETURNING {qn(meta.pk.column)}, {', '.join(qn(field.column) for field in keys)}"
        )
        returned = cursor.fetchall()
        cursor.execute(f"DROP TABLE {temp}")
    converters = [field.from_db_value if hasattr(field, "from_db_value") else None for field in [meta.pk, *keys]]
    ids = {}
    for row in returned:
        values = [convert(value, None, connection) if convert else value for convert, value in zip(converters, row)]
        ids[tuple(values[1:])] = values[0]
    for obj in objs:
        obj.pk = ids[tuple(getattr(obj, field.attname) for field in keys)]
        obj._state.adding, obj._state.db = False, using


def any_of(values, db_type: str, *, using: str = "default"):
    """The right side of a ``field__in=`` filter over many values: on PostgreSQL ONE array parameter,
    ``SELECT unnest(%s::<db_type>[])``, instead of one placeholder per value that Django compiles and
    psycopg binds one by one (6 s for the 100 000 job ids of a large ingestion); elsewhere the list."""
    values = list(values)
    if connections[using].vendor != "postgresql":
        return values
    if not re.fullmatch(r"[a-z ]+", db_type):
        raise ValueError(f"any_of: {db_type!r} is not a plain SQL type name")
    return RawSQL(f"SELECT unnest(%s::{db_type}[])", [values])


def insert_together(*objs: Model | Callable[[], Model], using: str = "default") -> list[Model]:
    """INSERT new rows of any models with ONE statement: ``WITH a AS (INSERT …), b AS (INSERT …)
    INSERT …`` — one round trip instead of one per row (a job, its first event and its audit event:
    bench/bench_post_profile.py). Each INSERT is the one ``obj.save(force_insert=True)`` would run,
    built by Django's own compiler (``pre_save``: ``auto_now_add`` and defaults are set on the
    objects); the statement is atomic like any other, and a unique or check violation raises
    IntegrityError as the separate inserts would. PostgreSQL checks the foreign keys among them at
    commit (Django makes them DEFERRABLE INITIALLY DEFERRED), so a row may point at another row of
    the same call. Objects whose primary key the database assigns (an AutoField) are inserted, but
    their ``pk`` stays None: use it for rows nobody reads back in the same request. No signals are
    sent (the portal uses none for its rows). An item may be a callable making the object, called
    once the items before it are prepared (an event whose ``at`` is its job's ``created_at``).
    Returns the objects. Elsewhere than PostgreSQL: ``save(force_insert=True)`` each."""
    connection = connections[using]
    made: list[Model] = []
    statements: list[str] = []
    params: list = []
    for item in objs:
        obj = item() if callable(item) else item
        made.append(obj)
        if connection.vendor != "postgresql":
            obj.save(force_insert=True, using=using)
            continue
        meta = obj._meta
        fields = [
            f for f in meta.local_concrete_fields
            if not getattr(f, "generated", False) and not (f is meta.auto_field and obj.pk is None)
        ]  # fmt: skip
        sql, sql_params = _insert_statement(obj, fields, using)
        statements.append(sql)
        params.extend(sql_params)
    if not statements:
        return made
    *first, last = statements
    sql = (("WITH " + ", ".join(f"i{n} AS ({s})" for n, s in enumerate(first)) + " ") if first else "") + last
    with prepared_cursor(using) as cursor:
        cursor.execute(sql, params)
    for obj in made:
        obj._state.adding = False
        obj._state.db = using
    return made


# The text of the INSERT Django's compiler builds for a model and its fields, which does not depend
# on the values unless one is an expression or a field has its own placeholder (then never kept):
# compiling it was 0.5 ms of a single-job POST's Python (63 fields over three rows). Kept with it,
# per field: whether its pre_save is Field's own (the attribute as it is) and whether its
# get_db_prep_save leaves None as None — then the compiler's two calls per such field are skipped.
_INSERT_TEXT: dict[tuple, tuple[str, tuple[tuple[Any, bool, bool], ...]]] = {}


def _insert_statement(obj: Model, fields: list, using: str) -> tuple[str, Sequence]:
    """The ``INSERT … VALUES (%s, …)`` and its parameters that ``obj.save(force_insert=True)`` would
    run: the values as the compiler prepares them (``pre_save``, ``get_db_prep_save``), the text
    from the first compile of the same model and fields."""
    from django.db.models import Field
    from django.db.models.sql import InsertQuery

    query = InsertQuery(type(obj))
    query.insert_values(fields, [obj], raw=False)
    compiler = query.get_compiler(using=using)
    key = (type(obj), tuple(fields), using)
    kept = _INSERT_TEXT.get(key)
    if kept is not None:
        text, plan = kept
        values = []
        for field, plain, none_stays in plan:
            value = getattr(obj, field.attname) if plain else compiler.pre_save_val(field, obj)
            values.append(None if value is None and none_stays else compiler.prepare_value(field, value))
        if not any(hasattr(value, "as_sql") for value in values):
            return text, values
    [(text, params)] = compiler.as_sql()
    if len(params) == len(fields) and not any(
        hasattr(value, "as_sql") or hasattr(field, "get_placeholder") for field, value in zip(fields, params, strict=True)
    ):
        connection = connections[using]
        plan = tuple((f, type(f).pre_save is Field.pre_save, f.get_db_prep_save(None, connection) is None) for f in fields)
        _INSERT_TEXT[key] = (text, plan)
    return text, params


# psycopg converts a query's %s placeholders once per distinct statement (an LRU cache), but only
# for statements of at most 4096 bytes and 50 parameters (psycopg._queries, 3.3): a single-job
# submission's one INSERT … WITH (insert_together: the job, its event, its audit event) has more
# and was split again on every request — 0.4 ms of a 2.8 ms POST (bench/bench_post_profile.py).
STATEMENT_CACHE_MAX_PARAMS = 400
STATEMENT_CACHE_MAX_BYTES = 32768


def psycopg_statement_cache_widen() -> bool:
    """Let psycopg keep the conversion of the portal's longer statements (PortalConfig.ready).
    False when this psycopg has no such limits (nothing to do; tests/portal/test_db.py notices)."""
    try:
        from psycopg import _queries
    except ImportError:
        return False
    if not hasattr(_queries, "MAX_CACHED_STATEMENT_PARAMS") or not hasattr(_queries, "MAX_CACHED_STATEMENT_LENGTH"):
        return False
    _queries.MAX_CACHED_STATEMENT_PARAMS = max(_queries.MAX_CACHED_STATEMENT_PARAMS, STATEMENT_CACHE_MAX_PARAMS)
    _queries.MAX_CACHED_STATEMENT_LENGTH = max(_queries.MAX_CACHED_STATEMENT_LENGTH, STATEMENT_CACHE_MAX_BYTES)
    return True


def prepared_cursor(using: str = "default"):
    """A cursor whose statements PostgreSQL parses and plans once per connection (a prepared
    statement: psycopg's ``prepare=True``, the parameters bound by the server) instead of at every
    execution as with Django's cursors (client-side binding; Django sets psycopg's prepare_threshold
    to None). For the few long statements every submission runs with the same text: with them the
    single-job POST cost PostgreSQL 1.9–2.1 ms of CPU instead of 3.1–3.6, and its Python no more
    (bench/results.md). Wrapped as Django's cursors are: counted, logged, execute_wrapper'd.
    ``DATABASE_PREPARED_STATEMENTS=0`` (a pooler that cannot keep them, such as PgBouncer in
    transaction mode before 1.21) or elsewhere than PostgreSQL: ``connection.cursor()``."""
    from django.conf import settings

    connection = connections[using]
    if connection.vendor != "postgresql" or not settings.DATABASE_PREPARED_STATEMENTS:
        return connection.cursor()
    connection.ensure_connection()
    raw = connection.connection
    if raw.prepare_threshold is None:  # Django's: psycopg prepares nothing, asked or not
        raw.prepare_threshold = _PREPARE_ONLY_WHEN_ASKED  # Django's client-side cursors never ask
    with connection.wrap_database_errors:
        return connection._prepare_cursor(_prepared_cursor_class()(raw))


_PREPARE_ONLY_WHEN_ASKED = 2**31 - 1  # executions before psycopg would prepare a statement unasked


@functools.cache
def _prepared_cursor_class():
    from django.db.backends.postgresql.base import ServerBindingCursor

    class PreparedCursor(ServerBindingCursor):
        def execute(self, query, params=None, *, prepare=None, binary=None):
            return super().execute(query, params, prepare=True if prepare is None else prepare, binary=binary)

    return PreparedCursor


@contextlib.contextmanager
def pipelined(using: str = "default") -> Iterator[None]:
    """Statements of the block go to PostgreSQL without waiting for each answer (psycopg's pipeline
    mode): they travel together with the transaction's BEGIN until the block fetches a result (or
    ends), so BEGIN and N statements cost one round trip instead of N + 1. An error surfaces at that
    fetch, as the same Django exception. Elsewhere than PostgreSQL with psycopg 3, or when the
    connection is already pipelined, a plain block.

    Measured on the single-job POST (bench/results.md): BEGIN, the job's INSERT and the budget hold
    in one round trip, then COMMIT — two round trips instead of four."""
    connection = connections[using]
    connection.ensure_connection()
    raw = connection.connection
    if connection.vendor != "postgresql" or not hasattr(raw, "pipeline") or getattr(raw, "_pipeline", None) is not None:
        yield
        return
    with raw.pipeline():
        yield
