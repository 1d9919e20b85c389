"""Database helpers the ORM lacks."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
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
    ``queryset.bulk_update`` would."""
    if not objs:
        return 0
    connection = connections[queryset.db]
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
    database generates (AutoField) is left to its sequence."""
    if not objs:
        return 0
    model = type(objs[0])
    connection = connections[using]
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
    bulk_create)."""
    if not objs:
        return
    model = type(objs[0])
    connection = connections[using]
    meta = model._meta
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


def any_of(values, db_type: str):
    """The right side of a ``field__in=`` filter over many values: on PostgreSQL ONE array parameter,
    ``SELECT unnest(%s::<db_type>[])``, instead of one placeholder per value that Django compiles and
    psycopg binds one by one (6 s for the 100 000 job ids of a large ingestion)."""
    if not re.fullmatch(r"[a-z ]+", db_type):
        raise ValueError(f"any_of: {db_type!r} is not a plain SQL type name")
    return RawSQL(f"SELECT unnest(%s::{db_type}[])", [list(values)])
