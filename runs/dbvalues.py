"""A model's values on their way to the database, and its rows on their way back, without
Django's per-field machinery (for runs/sql.py and toolcalls/sql.py, PostgreSQL's paths).

`Field.get_db_prep_save` ran for every column of every row those statements wrote, and
psycopg's array dumper (pure Python, per element) for every value of a batch's rows: together
a fifth of a dispatch worker's CPU (py-spy). Here a value whose type is already what the ORM
would hand psycopg — a `str` for a text column, an `int` for an integer one, an aware
datetime, a dict or list for JSON — is taken as it is (a JSON value dumped by the field's own
`json.dumps`); any other value goes through the field's `get_db_prep_save`. A batch's rows go
as ONE parameter, a JSON array of objects that orjson writes in C and PostgreSQL unpacks with
`json_to_recordset` (columns typed as the table's, JSON columns carried as the text the ORM
sends and cast). tests/test_runs_dbvalues.py proves the rows equal the ORM's, compared as PostgreSQL
prints them (to_jsonb of each row).
"""

from __future__ import annotations

import operator
import re
from datetime import datetime
from typing import Any

import orjson
from django.db import models
from django.db.backends.postgresql.operations import get_json_dumps
from django.db.models.base import ModelState
from django.db.models.fields import NOT_PROVIDED, AutoFieldMixin
from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute
from django.db.models.query_utils import DeferredAttribute
from django.db.models.signals import post_init, pre_init
from django.dispatch.dispatcher import NO_RECEIVERS
from psycopg.types.json import Jsonb

_TEXT, _INTEGER, _BOOLEAN, _DATETIME, _JSON, _OTHER = range(6)
# A kind's rule holds for a field whose preparing methods are those of these classes.
_RULES = [
    (_JSON, (models.JSONField,)),
    (_DATETIME, (models.DateTimeField,)),
    (_BOOLEAN, (models.BooleanField,)),
    (_INTEGER, (models.IntegerField, AutoFieldMixin)),
    (_TEXT, (models.CharField,)),
    (_TEXT, (models.TextField,)),
]
_PREPARING = ("get_prep_value", "get_db_prep_value", "get_db_prep_save", "to_python")


def _kind(field: models.Field) -> int:
    if field.is_relation and type(field).get_db_prep_save is not models.ForeignKey.get_db_prep_save:
        return _OTHER
    target = field.target_field if field.is_relation else field
    for kind, bases in _RULES:
        if isinstance(target, bases[0]) and all(
            any(getattr(type(target), name) is getattr(base, name, None) for base in bases)
            for name in _PREPARING
        ):
            return kind
    return _OTHER


_FAST_TYPE = {_TEXT: str, _INTEGER: int, _BOOLEAN: bool}


def _needs_pre_save(field: models.Field, add: bool) -> bool:
    if isinstance(field, models.DateField):  # DateTimeField too: only its auto dates
        return bool(field.auto_now or (add and field.auto_now_add))
    return type(field).pre_save is not models.Field.pre_save


class Plan:
    """How one model's rows are written (built once per model and connection)."""

    def __init__(self, model: Any, conn: Any) -> None:
        self.model, self.conn = model, conn
        self.fields = list(model._meta.concrete_fields)
        self.attnames = [f.attname for f in self.fields]
        self.every = list(range(len(self.fields)))
        self.kinds = [_kind(f) for f in self.fields]
        self.keys = [f"c{i}" for i in range(len(self.fields))]
        self.dumps = [get_json_dumps(f.encoder) if k == _JSON else None for f, k in self._pairs()]
        # What get_db_prep_save wraps an integer in for psycopg (Int4, Int2…), if anything.
        self.int_wraps = [self._int_wrap(f) if k == _INTEGER else None for f, k in self._pairs()]
        self.pre_save = {
            add: [_needs_pre_save(f, add) for f in self.fields] for add in (True, False)
        }
        # The types taken as they are are what PostgreSQL's operations hand psycopg; another
        # backend's (SQLite: dates as text) get every value from its field.
        self.fast = conn.vendor == "postgresql"
        self.json_ok = self.fast and _OTHER not in self.kinds
        self._columns: dict[tuple[tuple[int, ...], bool | None], _Columns] = {}

    def _pairs(self) -> Any:
        return zip(self.fields, self.kinds, strict=True)

    def _int_wrap(self, field: models.Field) -> Any:
        wrapped = type(field.get_db_prep_save(1, self.conn))
        return None if wrapped is int else wrapped

    def columns(self, indexes: list[int], add: bool | None) -> _Columns:
        """These columns (positions in `fields`) for writes that `pre_save(obj, add)` (none
        for add=None), made once."""
        key = (tuple(indexes), add)
        found = self._columns.get(key)
        if found is None:
            found = self._columns[key] = _Columns(self, indexes, add)
        return found

    def param(self, index: int, value: Any) -> Any:
        """`field.get_db_prep_save(value)`, a statement's parameter for psycopg."""
        kind = self.kinds[index]
        if not self.fast:
            return self.fields[index].get_db_prep_save(value, self.conn)
        if value is None:
            return None
        if kind == _JSON and type(value) in (dict, list):
            return Jsonb(value, dumps=self.dumps[index])
        if _fast(kind, value):
            wrap = self.int_wraps[index]
            return value if wrap is None else wrap(value)
        return self.fields[index].get_db_prep_save(value, self.conn)

    def json_value(self, index: int, value: Any) -> Any:
        """What the ORM's parameter says, as a value of the JSON document: the same text for
        a JSON column (the field's dumps), the value itself for the others."""
        kind = self.kinds[index]
        if value is None:
            return None
        if kind == _JSON:
            if type(value) not in (dict, list):
                # Value(None, JSONField()) is JSON null; an expression is refused by orjson.
                value = self.fields[index].get_db_prep_save(value, self.conn)
                if not isinstance(value, Jsonb):
                    return value
                return (value.dumps or self.dumps[index])(value.obj)
            return self.dumps[index](value)
        if _fast(kind, value):
            return value
        return self.fields[index].get_db_prep_save(value, self.conn)

    def params(self, obj: Any, indexes: list[int], add: bool | None) -> list[Any]:
        """The parameters of these columns of the row, as `get_db_prep_save` gives them."""
        columns = self.columns(indexes, add)
        values = columns.raw(obj)
        if not columns.plain(values):
            return [self.param(i, v) for i, v in zip(indexes, values, strict=True)]
        for position, dumps in columns.jsons:
            if values[position] is not None:
                values[position] = Jsonb(values[position], dumps=dumps)
        for position, wrap in columns.wraps:
            if values[position] is not None:
                values[position] = wrap(values[position])
        return values

    def json_rows(self, objs: list[Any], indexes: list[int], add: bool | None) -> str:
        """These columns of the rows as one JSON document (`recordset` unpacks it)."""
        columns = self.columns(indexes, add)
        rows = []
        for obj in objs:
            values = columns.raw(obj)
            if columns.plain(values):
                for position, dumps in columns.jsons:
                    if values[position] is not None:
                        values[position] = dumps(values[position])
            else:
                values = [self.json_value(i, v) for i, v in zip(indexes, values, strict=True)]
            rows.append(dict(zip(columns.keys, values, strict=True)))
        return orjson.dumps(rows).decode()

    def recordset(self, indexes: list[int], alias: str) -> tuple[list[str], str]:
        """(the select list, the FROM item) that unpack json_rows' document of these columns.
        For the callers' statements, which they make once."""
        selects, columns = [], []
        for i in indexes:
            # varchar(40) is varchar: the column's own type checks the length on write. A JSON
            # column arrives as the ORM's text and is cast, as the ORM's parameter is.
            kind = "text" if self.kinds[i] == _JSON else _untyped(self.fields[i], self.conn)
            columns.append(f"{self.keys[i]} {kind}")
            cast = "::jsonb" if self.kinds[i] == _JSON else ""
            selects.append(f"{alias}.{self.keys[i]}{cast}")
        return selects, f"json_to_recordset(%s::json) AS {alias}({', '.join(columns)})"


class _Columns:
    """Some columns of a plan, for one kind of write. A row's values are read from the
    instance's __dict__ in one step (an itemgetter), and the row is "plain" when each value's
    type is one that its column takes as it is (a few type signatures, remembered) and its
    datetimes are aware: then only its JSON values (dumped) and integers (wrapped, for psycopg)
    change; any other row takes every value through `Plan.param`/`json_value`."""

    def __init__(self, plan: Plan, indexes: list[int], add: bool | None) -> None:
        attnames = [plan.attnames[i] for i in indexes]
        self.attnames, self.keys = attnames, [plan.keys[i] for i in indexes]
        getter = operator.itemgetter(*attnames)
        self.get = getter if len(attnames) > 1 else lambda values: (getter(values),)
        positions = list(enumerate(indexes))
        self.pre_save = [
            (p, plan.fields[i]) for p, i in positions if add is not None and plan.pre_save[add][i]
        ]
        self.add = add
        self.allowed = [_ALLOWED[plan.kinds[i]] if plan.fast else () for i in indexes]
        # A str subclass (a TextChoices member: a status) is what a text field's preparing
        # hands psycopg as it is (to_python keeps any str), unlike an IntEnum, which int()
        # makes a plain int.
        self.subclasses = [plan.fast and plan.kinds[i] == _TEXT for i in indexes]
        self.datetimes = [p for p, i in positions if plan.kinds[i] == _DATETIME]
        self.jsons = [(p, plan.dumps[i]) for p, i in positions if plan.kinds[i] == _JSON]
        self.wraps = [(p, plan.int_wraps[i]) for p, i in positions if plan.int_wraps[i]]
        self.signatures: set[tuple[type, ...]] = set()

    def raw(self, obj: Any) -> list[Any]:
        """The values `field.pre_save(obj, add)` gives (the attributes for add=None)."""
        try:
            values = list(self.get(obj.__dict__))
        except KeyError:  # a deferred field: its descriptor loads it, as getattr does
            values = [getattr(obj, name) for name in self.attnames]
        for position, field in self.pre_save:
            values[position] = field.pre_save(obj, self.add)
        return values

    def plain(self, values: list[Any]) -> bool:
        signature = tuple(map(type, values))
        if signature not in self.signatures:
            if not all(map(_takes, signature, self.allowed, self.subclasses)):
                return False
            if len(self.signatures) < 64:
                self.signatures.add(signature)
        for position in self.datetimes:
            value = values[position]
            if value is not None and value.utcoffset() is None:
                return False  # naive: the field makes it aware (and warns)
        return True


_NONE = type(None)
_ALLOWED = {
    _TEXT: (str, _NONE),
    _INTEGER: (int, _NONE),
    _BOOLEAN: (bool, _NONE),
    _DATETIME: (datetime, _NONE),
    _JSON: (dict, list, _NONE),
    _OTHER: (),
}


def _takes(kind: type, allowed: tuple[type, ...], subclass_of_str: bool) -> bool:
    return kind in allowed or (subclass_of_str and issubclass(kind, str))


def _fast(kind: int, value: Any) -> bool:
    if kind == _DATETIME:
        return type(value) is datetime and value.utcoffset() is not None
    return type(value) is _FAST_TYPE.get(kind)


def _untyped(field: models.Field, conn: Any) -> str:
    return re.sub(r"\(.*\)", "", field.db_type(conn))


_PLANS: dict[tuple[Any, str], Plan] = {}


def plan(model: Any, conn: Any) -> Plan:
    found = _PLANS.get((model, conn.alias))
    if found is None:
        found = _PLANS[(model, conn.alias)] = Plan(model, conn)
    return found


def from_row(model: Any, conn: Any, row: Any) -> Any:
    """The instance of a whole row as the ORM reads it: each value converted by its field's
    `from_db_value` (the JSON ones: only those fields have one here), then `make`."""
    found = _READS.get(model)
    if found is None:
        fields = model._meta.concrete_fields
        converters = [
            (p, f.from_db_value) for p, f in enumerate(fields) if hasattr(f, "from_db_value")
        ]
        found = _READS[model] = ([f.attname for f in fields], converters)
    attnames, converters = found
    values = list(row)
    for position, convert in converters:
        if values[position] is not None:
            values[position] = convert(values[position], None, conn)
    return make(model, conn.alias, attnames, values)


_READS: dict[Any, tuple[list[str], list[tuple[int, Any]]]] = {}


def make(model: Any, alias: str, attnames: list[str], values: list[Any]) -> Any:
    """`model.from_db(alias, attnames, values)` for a whole row (every concrete field, in
    order) without running `Model.__init__`'s loop: with no init signal listening and no field
    whose descriptor does more than store the value (django-fsm's state proxies change the
    class), the instance it makes has the same attributes. tests/test_toolcalls_sql.py
    compares them with the ORM's."""
    if not _plain_init(model):
        return model.from_db(alias, attnames, values)
    obj = model.__new__(model)
    state = ModelState()
    state.adding, state.db = False, alias
    obj.__dict__["_state"] = state
    obj.__dict__.update(zip(attnames, values, strict=True))
    remember = getattr(obj, "_remember_all", None)
    if remember is not None:
        remember()  # as SavesChangedFields.from_db does
    return obj


_PLAIN: dict[Any, bool] = {}


def _init_signalled(model: Any) -> bool:
    """Whether pre_init or post_init has a listener for `model`: none when neither signal
    has any receiver (this project connects none), or when their caches say so (every
    connect and disconnect clears them), without a call; `has_listeners` was three calls
    per signal for every row made (4,800 per 200 dispatched calls, profile_dispatch
    --profile)."""
    if not pre_init.receivers and not post_init.receivers:
        return False
    if (
        pre_init.sender_receivers_cache.get(model) is NO_RECEIVERS
        and post_init.sender_receivers_cache.get(model) is NO_RECEIVERS
    ):
        return False
    return pre_init.has_listeners(model) or post_init.has_listeners(model)


def _plain_init(model: Any) -> bool:
    if _init_signalled(model):
        return False
    plain = _PLAIN.get(model)
    if plain is None:
        plain = _PLAIN[model] = not any(
            getattr(f, "state_proxy", None) for f in model._meta.concrete_fields
        )
    return plain


def new(model: Any, values: dict[str, Any]) -> Any:
    """`model(**values)` for a new row, without `Model.__init__`'s generic loop (a quarter of
    an event's append, profile_propose): a field named in `values` (by attname, or by name for
    a related object) is set as `__init__` sets it, the others take their defaults. A field
    whose descriptor only stores the value (most) is stored in `__dict__` directly; the others
    (a related object, django-fsm's protected status) through their descriptor, as `__init__`
    does. A model with an `__init__` of its own, an init signal listening or a generated
    field, or a name `__init__` would treat otherwise, gets `model(**values)`.
    tests/test_runs_dbvalues.py compares the two."""
    spec = _new_spec(model)
    if spec is None or not spec.accepts.issuperset(values) or _init_signalled(model):
        return model(**values)
    obj = model.__new__(model)
    attributes = obj.__dict__
    attributes["_state"] = ModelState()
    taken = 0
    for name, attname, storing, make_default, default in spec.fields:
        if name is not None and name in values:  # a related object: its descriptor caches it
            setattr(obj, name, values[name])
            taken += 1
            continue
        if attname in values:
            value = values[attname]
            taken += 1
        elif make_default is None:
            value = default
        else:
            value = make_default()
        if storing:
            attributes[attname] = value
        else:
            setattr(obj, attname, value)
    if taken != len(values):  # a relation given both ways: __init__ decides
        return model(**values)
    return obj


class _NewSpec:
    def __init__(self, model: Any) -> None:
        self.fields = [
            (
                f.name if f.is_relation else None,
                f.attname,
                type(model.__dict__.get(f.attname)) in _STORING,
                *_default_of(f),
            )
            for f in model._meta.concrete_fields
        ]
        self.accepts = frozenset(
            [f.attname for f in model._meta.concrete_fields]
            + [f.name for f in model._meta.concrete_fields if f.is_relation]
        )


def _default_of(field: models.Field) -> tuple[Any, Any]:
    """(None, the default) when `get_default` gives the same object every time: no callable
    default, no database default, Field's own `get_default` (a foreign key has its own);
    otherwise (`get_default`, None), which is asked each time (a test may change what it
    makes). Its call was 21 per dispatched call, two frames each (profile_dispatch
    --profile), most of them for constants."""
    own = type(field).get_default is not models.Field.get_default
    if (
        own
        or field.db_default is not NOT_PROVIDED
        or (field.has_default() and callable(field.default))
    ):
        return field.get_default, None
    return None, field.get_default()  # the default object itself, '' or None


_NEW: dict[Any, _NewSpec | None] = {}
# The descriptors whose __set__ on a new instance only stores the value in __dict__.
_STORING = (DeferredAttribute, ForeignKeyDeferredAttribute)


def _new_spec(model: Any) -> _NewSpec | None:
    if model in _NEW:
        return _NEW[model]
    fields = model._meta.concrete_fields
    plain = (
        model.__init__ is models.Model.__init__
        and len(fields) == len(model._meta.fields)
        and not any(f.generated for f in fields)
    )
    found = _NEW[model] = _NewSpec(model) if plain else None
    return found
