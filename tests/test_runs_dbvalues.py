"""runs/dbvalues.py writes what the ORM writes, compared in PostgreSQL's own text form of the
rows (jsonb as stored, timestamptz to the microsecond): a batch's rows in one JSON parameter,
a few rows' parameters, a transition's UPDATE of one row and of many; and it makes from a
row the instance `from_db` makes."""

from __future__ import annotations

import warnings
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db import connection, models, transaction
from django.db.models import Value
from django.db.models.signals import post_init
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from runs import dbvalues, sql
from runs.models import Event, OutboxMessage, Run
from tests.helpers import REFUND, propose_in
from tests.sandbox_process import Sandbox
from toolcalls import sql as toolcalls_sql
from toolcalls.models import Receipt, ToolCall

pytestmark = pytest.mark.django_db
MOMENT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
# What a column's text form could lose or change on the way: escapes, array and JSON syntax,
# numbers jsonb keeps with their scale, offsets other than UTC, a whole second.
PAYLOADS = [
    {"a": 'é "quoted" \\ back,slash {braces} NULL\n\ttab 🎉', "n": None, "t": True},
    {"floats": [0.1, 1.5, 2.5e-07, 1e21, 123456.789], "big": 2**53 - 1, "neg": -7},
    {"nested": {"z": [], "a": {}, "é": [1, [2, [3]]]}, "empty": ""},
    {},
]
TEXTS = ["", "plain", 'it\'s "x" \\ , {} NULL', "é🎉\u2028", " spaced "]
MOMENTS = [
    MOMENT,
    MOMENT.replace(microsecond=0),
    MOMENT.astimezone(ZoneInfo("America/New_York")),
    MOMENT.astimezone(timezone(timedelta(hours=5, minutes=30))),
]


def _events(run: Run, count: int) -> list[Event]:
    return [
        Event(
            id=f"ev_dbvalues{i:04d}",
            run_id=run.pk,
            seq=1000 + i,
            event_type="test.written",
            schema_version=1 + i % 3,
            producer=TEXTS[i % len(TEXTS)],
            tenant_id=run.tenant_id,
            actor=TEXTS[(i + 1) % len(TEXTS)],
            tool_call_id=f"tc_{i}",
            correlation_id=TEXTS[(i + 2) % len(TEXTS)],
            occurred_at=MOMENTS[i % len(MOMENTS)],
            recorded_at=MOMENTS[(i + 1) % len(MOMENTS)],
            payload=PAYLOADS[i % len(PAYLOADS)],
            prev_hash="0" * 64,
            hash=f"{i:064d}",
        )
        for i in range(count)
    ]


RAW_RESPONSES = [["a list", 1], "a JSON string", {1: "an integer key", "big": 2**70}, {}]


def _text_rows(model: Any, ids: list[Any], *leave_out: str) -> list[str]:
    """The rows as PostgreSQL gives them in JSON (jsonb as stored, numbers with their scale,
    timestamptz to the microsecond), less some columns."""
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT (to_jsonb(t) - %s::text[])::text FROM {table} t"
            " WHERE t.id = ANY(%s) ORDER BY t.id",
            [list(leave_out), ids],
        )
        return [row[0] for row in cursor.fetchall()]


def _written_twice(model: Any, make: Any, write: Any, *leave_out: str) -> tuple[list, list]:
    """The rows `write` leaves and the rows the ORM's bulk_create leaves, of the same
    objects (each written in a savepoint that is then rolled back)."""
    results = []
    for writer in (write, lambda objs: model.objects.bulk_create(objs)):
        with transaction.atomic():
            objs = make()
            writer(objs)
            results.append(_text_rows(model, [obj.pk for obj in objs], *leave_out))
            transaction.set_rollback(True)
    return results[0], results[1]


# 2 events go as a VALUES list's parameters, 9 (past psycopg's 50 cached ones) as one JSON
# parameter.
@pytest.mark.parametrize("count", [2, 9])
def test_events_are_the_rows_the_orm_writes(run: Run, count: int) -> None:
    with CaptureQueriesContext(connection) as queries:
        mine, orm = _written_twice(Event, lambda: _events(run, count), sql.insert_events)

    inserts = [q["sql"] for q in queries if q["sql"].startswith('INSERT INTO "runs_event"')]
    assert ("json_to_recordset" in inserts[0]) is (count > 2)
    assert len(mine) == count and mine == orm


@pytest.mark.parametrize("count", [2, 9])
def test_rows_with_naive_dates_json_scalars_and_nulls_are_the_orms(
    run: Run, sandbox: Sandbox, count: int
) -> None:
    """Values whose type the column does not take as it is go through their field, as the
    ORM's do: a naive datetime (made aware, with Django's warning), a JSON string, a
    TextChoices-like str subclass, an integer given as a bool; a JSON value is the text of
    the field's json.dumps (integer keys made strings, an integer past 64 bits)."""

    class Status(str):
        # The row holds the string itself, as the ORM's parameter (the value unchanged).
        def __str__(self) -> str:
            return "not what is written"

    call = propose_in(run)
    naive = MOMENT.replace(tzinfo=None)

    def receipts() -> list[Receipt]:
        return [
            Receipt(
                id=f"rcp_dbvalues{i:03d}",
                tool_call_id=call.pk,
                attempt_id=None,
                external_id=TEXTS[i % len(TEXTS)],
                status=Status("created") if i % 2 else "created",
                source=Receipt.Source.DISPATCH if i % 3 else "dispatch",
                raw_response=RAW_RESPONSES[i % len(RAW_RESPONSES)],
            )
            for i in range(count)
        ]

    def messages() -> list[OutboxMessage]:
        return [
            OutboxMessage(
                id=f"msg_dbvalues{i:03d}",
                task="t",
                args=[i, "x"],
                available_at=naive,
                published_count=True if i % 2 else 3,
                traceparent=None,
            )
            for i in range(count)
        ]

    # Not UTC: a naive datetime is the default zone's time (the ORM makes it aware so).
    with override_settings(TIME_ZONE="America/New_York"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the naive datetime's
        for model, make in ((Receipt, receipts), (OutboxMessage, messages)):
            # created_at is auto_now_add: the moment of each write.
            mine, orm = _written_twice(model, make, sql.insert_rows, "created_at")
            assert len(mine) == count and mine == orm


def _changed(call: ToolCall, i: int) -> None:
    call.result = PAYLOADS[i % len(PAYLOADS)] if i % 3 else None
    call.external_id = TEXTS[i % len(TEXTS)]
    call.status_since = MOMENTS[i % len(MOMENTS)]
    call.lease_expires_at = None if i % 2 else MOMENTS[(i + 1) % len(MOMENTS)]
    call.fencing_token = 7 + i


NAMES = ["result", "external_id", "status_since", "lease_expires_at", "fencing_token", "updated_at"]


@pytest.mark.parametrize("count", [1, 4])
def test_a_transitions_update_leaves_the_row_the_orms_save_leaves(
    run: Run, sandbox: Sandbox, count: int
) -> None:
    ids = [
        propose_in(run, {**REFUND, "amount_cents": 10 + i}, intent=f"u{i}").pk for i in range(count)
    ]
    results = []
    for write in ("orm", "sql"):
        with transaction.atomic():
            calls = [ToolCall.objects.get(pk=pk) for pk in ids]
            for i, call in enumerate(calls):
                _changed(call, i)
                call.updated_at = MOMENT  # auto_now: set by both writes, compared apart
            if write == "orm":
                for call in calls:
                    call.save(update_fields=NAMES)
            else:
                sql.update_many(calls, NAMES)
            rows = _text_rows(ToolCall, ids, "updated_at")
            results.append((rows, [c.updated_at for c in calls]))
            transaction.set_rollback(True)

    (orm, orm_times), (mine, my_times) = results
    assert len(mine) == count and mine == orm
    assert all(t > MOMENT for t in my_times + orm_times)  # auto_now set by both


def test_a_json_null_value_is_json_null_and_none_is_sql_null(run: Run, sandbox: Sandbox) -> None:
    calls = [ToolCall.objects.get(pk=propose_in(run, intent=f"n{i}").pk) for i in range(2)]
    calls[0].result, calls[1].result = Value(None, ToolCall._meta.get_field("result")), None
    with transaction.atomic():
        sql.update_many(calls, ["result"])
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, result IS NULL, result::text FROM toolcalls_toolcall"
                " WHERE id = ANY(%s) ORDER BY id",
                [[c.pk for c in calls]],
            )
            rows = {row[0]: row[1:] for row in cursor.fetchall()}
    assert rows[calls[0].pk] == (False, "null")
    assert rows[calls[1].pk] == (True, None)


def test_a_new_calls_parameters_are_the_orms(
    run: Run, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`toolcalls.sql.call_values` (the proposal's INSERT): each parameter as the field's
    get_db_prep_save gives it, with the same type for psycopg (Int4, Jsonb)."""
    call = ToolCall.objects.get(pk=propose_in(run).pk)
    monkeypatch.setattr("django.utils.timezone.now", lambda: MOMENT)  # the auto dates
    call.lease_expires_at = MOMENTS[2]
    mine = toolcalls_sql.call_values(call)
    fields = ToolCall._meta.concrete_fields
    orm = [f.get_db_prep_save(f.pre_save(call, True), connection) for f in fields]
    assert [type(v) for v in mine] == [type(v) for v in orm]
    plain = [getattr(v, "obj", v) for v in mine]
    assert plain == [getattr(v, "obj", v) for v in orm]


def test_a_row_is_made_as_from_db_makes_it(run: Run, sandbox: Sandbox) -> None:
    call = propose_in(run)
    fields = ToolCall._meta.concrete_fields
    values = [getattr(call, f.attname) for f in fields]
    names = [f.attname for f in fields]

    mine = dbvalues.make(ToolCall, "default", names, list(values))
    orm = ToolCall.from_db("default", names, list(values))

    assert type(mine) is ToolCall and mine.__dict__.keys() == orm.__dict__.keys()
    assert {k: v for k, v in mine.__dict__.items() if k != "_state"} == {
        k: v for k, v in orm.__dict__.items() if k != "_state"
    }
    assert (mine._state.adding, mine._state.db) == (orm._state.adding, orm._state.db)
    assert mine.changed_fields() == orm.changed_fields() == ["updated_at"]


def test_a_listener_of_init_gets_its_signal(run: Run, sandbox: Sandbox) -> None:
    call = propose_in(run)
    names = [f.attname for f in ToolCall._meta.concrete_fields]
    seen: list[Any] = []

    def listen(sender: Any, instance: Any, **kwargs: Any) -> None:
        seen.append(instance)

    post_init.connect(listen, sender=ToolCall)
    try:
        made = dbvalues.make(ToolCall, "default", names, [getattr(call, n) for n in names])
    finally:
        post_init.disconnect(listen, sender=ToolCall)
    assert seen == [made]


def test_a_field_that_prepares_its_own_way_is_prepared_by_it() -> None:
    """A field class overriding how it prepares a value (a str it upper-cases, say) gets
    every value through its get_db_prep_save, never taken as it is."""

    class Shouting(models.CharField):
        def get_prep_value(self, value: Any) -> Any:
            return super().get_prep_value(value).upper()

    assert dbvalues._kind(models.CharField(max_length=5)) != dbvalues._OTHER
    assert dbvalues._kind(Shouting(max_length=5)) == dbvalues._OTHER
