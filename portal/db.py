"""Database helpers the ORM lacks, each kept because an alternating end-to-end benchmark shows it
pays (bench/results.md, "Issue 38: portal/db.py through documented APIs"), and each through
documented surfaces or a maintained library: django-pgbulk (``pgbulk.update``),
psycopg's ``Cursor.copy`` on the DB-API cursor Django hands out, ``Model._meta`` and ``Model._state``
(both in Django's reference), ``Model.from_db`` ("Customizing model loading"), the Field API
(``pre_save``, ``get_prep_value``, ``get_db_prep_save``, ``from_db_value``) and PostgreSQL's
``json_populate_recordset``. No query compiler, no Django internals."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import ipaddress
import json
import operator
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal
from typing import Any

import pgbulk
from django.db import connections, models, transaction
from django.db.models import Model
from django.db.models.expressions import RawSQL


def copied_fields(source: object, names: Iterable[str]) -> dict[str, Any]:
    """``{name: source.name}`` for each of ``names``: the fields a row takes unchanged from another
    object (a gateway's typed result, the row it is cut from), as keyword arguments; the same names
    can then be a bulk upsert's ``update_fields``."""
    return {name: getattr(source, name) for name in names}


# From this many rows, bulk_update writes through COPY and a temporary table: one statement of
# ``rows × fields`` placeholders is parsed by psycopg on the client (4 000 GPU rows × 12 fields: 2 s of
# the GPU sync's 5.6 s at load 18, its values converted one by one for 2.4 s more; bench/results.md).
BULK_UPDATE_COPY_FROM = 500


def bulk_update(model: type[Model], objs: Sequence[Model], fields: Sequence[str], *, batch_size: int = 1000) -> int:
    """Write ``fields`` of ``objs`` (instances with their primary key) and return how many objects
    were given: what ``QuerySet.bulk_update`` does, without its ``CASE WHEN pk = … THEN …`` per row and
    field, which Django builds and compiles in Python (for 50 jobs × 10 fields that was 86 % of the
    batched relay's own time, 3.7 of 4.3 ms per job, bench/bench_relay.py; bench/results.md
    "portal/db.py through documented APIs" for the figures that keep it).

    Fewer than BULK_UPDATE_COPY_FROM objects: one ``UPDATE t SET f = v.f, … FROM (VALUES (…), …) AS v
    WHERE t.pk = v.pk`` per batch (django-pgbulk's ``pgbulk.update``). More: the values COPYed into a
    temporary table (psycopg's ``Cursor.copy``, _copy_rows' values) and one ``UPDATE … FROM`` it. Every
    row is written: callers lock the rows they mean (``select_for_update`` with their conditions) in
    the same transaction first."""
    if len(objs) >= BULK_UPDATE_COPY_FROM:
        _update_by_copy(model, objs, fields)
        return len(objs)
    for start in range(0, len(objs), batch_size):  # a statement's parameters are bounded (65 535)
        pgbulk.update(model, objs[start : start + batch_size], list(fields))
    return len(objs)


def _update_by_copy(model: type[Model], objs: Sequence[Model], names: Sequence[str], using: str = "default") -> None:
    connection = connections[using]
    meta = model._meta
    qn = connection.ops.quote_name
    fields = [meta.pk, *(meta.get_field(name) for name in names)]
    table, pk = qn(meta.db_table), qn(meta.pk.column)
    with transaction.atomic(using=using), connection.cursor() as cursor:
        temp = _temporary_copy(cursor, connection, meta, fields, objs, prefix="update", add=False)
        cursor.execute(
            f"UPDATE {table} SET " + ", ".join(f"{qn(f.column)} = v.{qn(f.column)}" for f in fields[1:])
            + f" FROM {temp} AS v WHERE {table}.{pk} = v.{pk}"
        )
        cursor.execute(f"DROP TABLE {temp}")


def _temporary_copy(cursor, connection, meta, fields, objs: Sequence[Model], *, prefix: str, add: bool,
                    ordinal: bool = False) -> str:  # fmt: skip
    """A temporary table of ``fields``' columns of the model's table holding the objects' values
    (_copy_rows'), written with ONE ``COPY … FROM STDIN`` (psycopg's ``Cursor.copy``, on the DB-API
    cursor Django hands out: docs topics/db/sql); returns its quoted name. ``ordinal``: a last column
    ``_n`` holds each object's index in ``objs``. The caller, inside its transaction, uses it in one
    statement and drops it."""
    qn = connection.ops.quote_name
    columns = ", ".join(qn(field.column) for field in fields)
    temp = qn(f"{prefix}_{meta.db_table}")
    cursor.execute(f"DROP TABLE IF EXISTS {temp}")
    extra = ", 0::integer AS _n" if ordinal else ""
    cursor.execute(f"CREATE TEMPORARY TABLE {temp} AS SELECT {columns}{extra} FROM {qn(meta.db_table)} WITH NO DATA")
    with cursor.copy(f"COPY {temp} ({columns}{', _n' if ordinal else ''}) FROM STDIN") as copy:
        for index, row in enumerate(_copy_rows(objs, fields, connection, add=add)):
            if ordinal:
                row.append(index)
            copy.write_row(row)
    return temp


def bulk_insert_copy(objs: Sequence, *, using: str = "default") -> int:
    """Insert new rows of one model (its instances, or its row_maker rows) with one ``COPY … FROM STDIN`` (psycopg's ``Cursor.copy``) and
    return how many: what ``bulk_create`` does for rows whose database-generated ids nobody needs
    back, without one INSERT holding a placeholder per value that Django compiles and psycopg binds
    (for usage slices that was two thirds of the ingestion's time; bench/bench_reports.py). The
    values are _copy_rows', as bulk_upsert_copy's."""
    if not objs:
        return 0
    connection = connections[using]
    meta = _model_of(objs[0])._meta
    qn = connection.ops.quote_name
    fields = [field for field in meta.concrete_fields if not field.db_returning]
    columns = ", ".join(qn(field.column) for field in fields)
    with connection.cursor() as cursor, cursor.copy(f"COPY {qn(meta.db_table)} ({columns}) FROM STDIN") as copy:
        for row in _copy_rows(objs, fields, connection):
            copy.write_row(row)
    return len(objs)


def _copy_rows(objs: Sequence[Model], fields, connection, *, add: bool = True):
    """Each object's values of ``fields`` as the database takes them: ``get_db_prep_save`` of the
    field's ``pre_save`` for a new row (``add``: auto_now fields filled in), as ``bulk_create`` does, or
    of the attribute's value for an update, as ``bulk_update`` does — except where that is the value
    itself (_plain_fields; None too: their ``get_db_prep_save`` of None is None)."""
    columns = list(zip(fields, _plain_fields(fields, connection)))
    values_of = operator.attrgetter(*(field.attname for field in fields))  # one C call per object
    for obj in objs:
        values = values_of(obj) if len(columns) > 1 else (values_of(obj),)
        yield [
            value if kind is not None and (value is None or type(value) is kind[0] and (kind[1] is None or kind[1](value)))
            else field.get_db_prep_save(field.pre_save(obj, add=True) if add else value, connection)
            for value, (field, kind) in zip(values, columns)
        ]  # fmt: skip


def bulk_upsert_copy(
    objs: Sequence, *, unique_fields: Sequence[str], update_fields: Sequence[str], using: str = "default"
) -> None:
    """Insert or update rows of one model (its instances, or its row_maker rows) by a unique key,
    setting each object's primary key: what
    ``bulk_create(update_conflicts=True, unique_fields=…, update_fields=…)`` does, as ``COPY`` into a
    temporary table and one ``INSERT … SELECT … ON CONFLICT (…) DO UPDATE … RETURNING`` whose rows are
    matched to the temporary table's by the key, giving each id with its object's index. Objects must
    not repeat a key (PostgreSQL refuses to update a row twice in one statement; so does
    bulk_create). Kept: the usage ingestion's first ingest of 20 000 records ran at 1 170-2 744
    rows/s with it against 973-1 645 with bulk_create(update_conflicts=True) in alternating runs
    (pgbulk.upsert, one INSERT … VALUES too: 609-1 018)."""
    if not objs:
        return
    model = _model_of(objs[0])
    connection = connections[using]
    meta = model._meta
    qn = connection.ops.quote_name
    fields = [field for field in meta.concrete_fields if not field.db_returning]
    keys = [meta.get_field(name) for name in unique_fields]
    updates = [meta.get_field(name) for name in update_fields]
    columns = ", ".join(qn(field.column) for field in fields)
    table = qn(meta.db_table)
    key = ", ".join(qn(field.column) for field in keys)
    with transaction.atomic(using=using), connection.cursor() as cursor:
        temp = _temporary_copy(cursor, connection, meta, fields, objs, prefix="upsert", add=True, ordinal=True)
        # each row's id back by its object's index: the key is matched in the database, and what comes
        # back is two integers a row, not the key's values for Python to convert and match
        cursor.execute(
            f"WITH written AS (INSERT INTO {table} ({columns}) SELECT {columns} FROM {temp} "
            f"ON CONFLICT ({key}) DO UPDATE SET "
            + ", ".join(f"{qn(field.column)} = EXCLUDED.{qn(field.column)}" for field in updates)
            + f" RETURNING {qn(meta.pk.column)} AS _written_id, {key}) "
            f"SELECT written._written_id, {temp}._n FROM written JOIN {temp} ON "
            + " AND ".join(f"written.{qn(field.column)} = {temp}.{qn(field.column)}" for field in keys)
        )
        returned = cursor.fetchall()
        cursor.execute(f"DROP TABLE {temp}")
    if len(returned) != len(objs):
        raise ValueError(f"bulk_upsert_copy: {len(objs)} rows, {len(returned)} ids back (a key repeated, or NULL)")
    pk = meta.pk
    convert = pk.from_db_value if hasattr(pk, "from_db_value") else None
    for value, index in returned:
        obj = objs[index]
        obj.pk = convert(value, None, connection) if convert else value
        if isinstance(obj, Model):
            obj._state.adding, obj._state.db = False, using  # Model._state: documented (ref/models/instances)


def _model_of(obj) -> type[Model]:
    """The model of a model instance, or of a row_maker row."""
    return type(obj) if isinstance(obj, Model) else obj.row_model


# Fields whose database value is the Python value itself when it has exactly this type (the field's
# own class, not a subclass, so no get_prep_value of someone else's) and passes the check beside it:
# psycopg adapts them as they are. What Django's own code does with such a value on PostgreSQL (5.2):
# Char/Text/Boolean/Integer fields return it; DateField.to_python returns a date as it is and
# adapt_datefield_value returns it; DateTimeField returns an aware datetime as it is (a naive one takes
# the slow path: Django warns and makes it aware); DecimalField makes Decimal(value) of a Decimal (the
# same number) and refuses one that is not finite (the slow path raises as Django does);
# adapt_decimalfield_value returns it; a UUIDField on a database with native UUIDs returns the UUID.
def _aware(value: dt.datetime) -> bool:
    return value.utcoffset() is not None


_PLAIN_FIELDS: dict[type, tuple[type, Any]] = {
    models.CharField: (str, None), models.TextField: (str, None), models.BooleanField: (bool, None),
    models.IntegerField: (int, None), models.BigIntegerField: (int, None), models.PositiveIntegerField: (int, None),
    models.PositiveBigIntegerField: (int, None), models.SmallIntegerField: (int, None),
    models.PositiveSmallIntegerField: (int, None), models.AutoField: (int, None), models.BigAutoField: (int, None),
    models.DateField: (dt.date, None), models.DateTimeField: (dt.datetime, _aware),
    models.DecimalField: (Decimal, Decimal.is_finite),
}  # fmt: skip


def _plain_fields(fields, connection) -> list[tuple[type, Any] | None]:
    """For each field, (the Python type whose values it writes unchanged — ``get_db_prep_save`` is the
    identity for them —, a check such a value must pass too, or None), or None. A foreign key writes
    its target field's value (ForeignKey.get_db_prep_save delegates to it). A row of COPY then skips
    two or three calls per such value (40 fields × 7 400 usage records of a day: 0.4 s of the
    ingestion, bench/results.md)."""
    out = []
    for field in fields:
        if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
            out.append(None)
            continue
        target = field.target_field if type(field) in (models.ForeignKey, models.OneToOneField) else field
        if type(target) is models.UUIDField and connection.features.has_native_uuid_field:
            out.append((uuid.UUID, None))
        else:
            out.append(_PLAIN_FIELDS.get(type(target)))
    return out


# The array types any_of writes as ONE literal ("{1,2,3}"), each value checked by its constructor
# first: psycopg dumps a list element by element in Python (7 400 UUIDs: ~10 ms; the text: ~1 ms).
_ARRAY_ELEMENTS: dict[str, Callable[[Any], Any]] = {
    "bigint": operator.index, "integer": operator.index, "smallint": operator.index,  # ints only: not 1.5, not "1"
    "uuid": lambda value: value if type(value) is uuid.UUID else uuid.UUID(str(value)),
}  # fmt: skip


def any_of(values, db_type: str):
    """The right side of a ``field__in=`` filter over many values: on PostgreSQL ONE array parameter,
    ``SELECT unnest(%s::<db_type>[])``, instead of one placeholder per value that Django compiles and
    psycopg binds one by one (6 s for the 100 000 job ids of a large ingestion). Integers and UUIDs go
    as one array literal of their checked values (a value that is not one raises here, as binding
    it would); other types as a list psycopg adapts."""
    if not re.fullmatch(r"[a-z ]+", db_type):
        raise ValueError(f"any_of: {db_type!r} is not a plain SQL type name")
    element = _ARRAY_ELEMENTS.get(db_type)
    param = "{" + ",".join(map(str, map(element, values))) + "}" if element else list(values)
    return RawSQL(f"SELECT unnest(%s::{db_type}[])", [param])


def rows_insert(*groups: Sequence[Model], using: str = "default") -> None:
    """Insert the new rows of several models in ONE statement: each group (objects of one model, or
    empty) is ONE JSON parameter that PostgreSQL expands into rows (``json_populate_recordset``),
    ``WITH i0 AS (INSERT INTO t0 (…) SELECT … FROM json_populate_recordset(NULL::t0, %s::json)), i1
    AS (…) SELECT 1``. The rows' values are what ``bulk_create`` writes (each field's ``pre_save``
    and ``get_db_prep_save``; JSONField's ``get_prep_value``), except that an ``auto_now_add`` field
    the caller set is kept (one timestamp for several rows); a primary key the database generates
    (an AutoField) is left to it and not read back. The objects are then marked saved
    (``Model._state``). Foreign keys between the groups are checked at the end of the statement, so
    a group may refer to the rows of an earlier one.

    Kept for the submission's job, its first event and its audit event (jobs.services.submit): one
    statement instead of three ``bulk_create``/``save`` calls, whose SQL Django compiles for every
    job (56 columns: ~1 ms of CPU) and whose 56 parameters psycopg splits and binds one by one (more
    than its query cache takes); here the statement's text is the same for every submission (one
    parameter per table: psycopg caches it and PostgreSQL runs it prepared). bench/results.md,
    "Issue 38: the POST's CPU (nineteenth session)"."""
    groups = [objs for objs in groups if objs]
    if not groups:
        return
    connection = connections[using]
    statements, params = [], []
    for index, objs in enumerate(groups):
        fields, plain, statement = _json_insert(type(objs[0]), connection)
        statements.append(f"i{index} AS ({statement})")
        params.append(_json_param([_json_row(obj, fields, plain, connection) for obj in objs]))
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {', '.join(statements)} SELECT 1", params)
    for objs in groups:
        for obj in objs:
            obj._state.adding, obj._state.db = False, using  # Model._state: documented (ref/models/instances)


_JSON_INSERTS: dict[type[Model], tuple[list, list, str]] = {}


def _json_insert(model: type[Model], connection) -> tuple[list, list, str]:
    """(the fields written, _plain_fields of them, the INSERT … SELECT of rows_insert) of a model,
    made once per process: every field but a primary key the database generates."""
    made = _JSON_INSERTS.get(model)
    if made is None:
        qn = connection.ops.quote_name
        fields = [field for field in model._meta.concrete_fields if not field.db_returning]
        columns = ", ".join(qn(field.column) for field in fields)
        table = qn(model._meta.db_table)
        statement = f"INSERT INTO {table} ({columns}) SELECT {columns} FROM json_populate_recordset(NULL::{table}, %s::json)"
        made = _JSON_INSERTS[model] = (fields, _plain_fields(fields, connection), statement)
    return made


def _json_row(obj: Model, fields, plain, connection, *, add: bool = True) -> dict[str, Any]:
    """One object's row for rows_insert (``add``: {column: value as bulk_create writes it}) or
    json_rows (not ``add``: as bulk_update writes it, the attribute's value)."""
    row = {}
    for field, kind in zip(fields, plain, strict=True):
        value = getattr(obj, field.attname)
        if kind is None or value is None or type(value) is not kind[0] or (kind[1] is not None and not kind[1](value)):
            if add and not (value is not None and getattr(field, "auto_now_add", False)):  # set by the caller: kept
                value = field.pre_save(obj, add=True)
            value = field.get_prep_value(value) if isinstance(field, models.JSONField) else field.get_db_prep_save(value, connection)
        row[field.column] = value
    return row


def _json_param(rows: list[dict[str, Any]]) -> str:
    return json.dumps(rows, default=_json_value, ensure_ascii=False, separators=(",", ":"))


def json_rows(objs: Sequence[Model], names: Sequence[str], *, add: bool = False, using: str = "default") -> str:
    """ONE JSON parameter holding ``names``' columns of each object (the primary key first when it is
    not among them) as the database takes them — as bulk_update writes them, or, ``add``, as
    bulk_create does —, for a statement that reads it with ``json_populate_recordset(NULL::<table>,
    %s::json)`` (rows_insert's form): the statement's text is then the same for any number of rows."""
    if not objs:
        return "[]"
    connection = connections[using]
    meta = type(objs[0])._meta
    fields = [meta.get_field(name) for name in names]
    if not add and meta.pk not in fields:
        fields.insert(0, meta.pk)
    plain = _plain_fields(fields, connection)
    return _json_param([_json_row(obj, fields, plain, connection, add=add) for obj in objs])


_LOADERS: dict[type[Model], tuple[list[str], list]] = {}


def model_columns(model: type[Model], alias: str, *, using: str = "default") -> str:
    """``alias."column", …`` for every concrete field of ``model`` in ``Model._meta`` order: the
    select list model_from_row reads back."""
    qn = connections[using].ops.quote_name
    return ", ".join(f"{alias}.{qn(field.column)}" for field in model._meta.concrete_fields)


def model_from_row(model: type[Model], values: Sequence[Any], *, using: str = "default") -> Model:
    """The instance of ``model`` whose concrete fields (model_columns' order) have ``values`` as the
    database returned them (a row of ``cursor.execute``): each field's ``from_db_value`` (the Field
    API; JSONField decodes its text there), then ``Model.from_db`` (ref/models/instances,
    "Customizing model loading") — what a queryset does with each row."""
    loaders = _LOADERS.get(model)
    if loaders is None:
        fields = model._meta.concrete_fields
        converters = [(index, field.from_db_value) for index, field in enumerate(fields) if hasattr(field, "from_db_value")]
        loaders = _LOADERS[model] = ([field.attname for field in fields], converters)
    names, converters = loaders
    if converters:
        connection = connections[using]
        values = list(values)
        for index, convert in converters:
            values[index] = convert(values[index], None, connection)
    return model.from_db(using, names, values)


def row_maker(model: type[Model]):
    """A function making plain rows of ``model`` from keyword values of its fields' attnames
    (``team_id``, not ``team``), every other field at its default — the values ``model(**values)``
    holds, in an object of one slot per concrete field (and ``pk``, the primary key's), not a model
    instance: what the COPY writers (bulk_insert_copy, bulk_upsert_copy; ``model=``) read. A model
    instance costs its constructor's setattr of every field, 27 µs for a usage record, a third of a
    new day's ingestion (7 400 records and their slices: bench/results.md, "Usage ingestion of a new
    day: rows, not model instances"); a row, its dataclass ``__init__``. An unknown name is a
    TypeError. A callable default (uuid4, now) is called per row."""
    fields = model._meta.concrete_fields
    pk_name = model._meta.pk.attname
    specs = []
    for field in fields:
        if field.has_default() and callable(field.default):
            default = dataclasses.field(default_factory=field.get_default)
        else:
            default = dataclasses.field(default=field.get_default())
        specs.append((field.attname, Any, default))
    namespace = {
        "pk": property(operator.attrgetter(pk_name), lambda row, value: setattr(row, pk_name, value)),
        "row_model": model,
    }
    return dataclasses.make_dataclass(f"{model.__name__}Row", specs, namespace=namespace, kw_only=True, slots=True, eq=False)


_IP_TYPES = (ipaddress.IPv4Address, ipaddress.IPv6Address, ipaddress.IPv4Interface, ipaddress.IPv6Interface)


def _json_value(value):
    """What json.dumps cannot write itself, as PostgreSQL reads it back into its column's type."""
    if isinstance(value, (uuid.UUID, decimal.Decimal, *_IP_TYPES)):
        return str(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    raise TypeError(f"rows_insert: no JSON form for {type(value).__name__}")
