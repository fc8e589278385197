"""runs/cursors.py's `cursor_for`: the same cursor again for the next statement, and a new one
whenever `connection.cursor()` would have made a different one (another connection, a health
check due, queries logged or not, another time zone); one per statement named, which keeps
psycopg's adapters for that statement from one run of it to the next."""

from __future__ import annotations

import datetime
import zoneinfo

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.postgresql import psycopg_any
from django.test.utils import CaptureQueriesContext

from runs import cursors as sql

pytestmark = pytest.mark.django_db


def _one(value: int) -> int:
    cursor = sql.cursor_for(connection)
    cursor.execute("SELECT %s", [value])
    return cursor.fetchone()[0]


def test_it_gives_the_same_cursor_to_the_next_statement() -> None:
    first = sql.cursor_for(connection)
    assert sql.cursor_for(connection) is first
    assert [_one(1), _one(2)] == [1, 2]


def test_a_new_connection_gets_a_new_cursor() -> None:
    before = sql.cursor_for(connection)
    kept = connection._kept_cursors
    connection._kept_cursors = (object(), *kept[1:])  # made on a connection since closed
    after = sql.cursor_for(connection)
    assert after is not before
    assert _one(3) == 3


def test_logged_queries_get_a_cursor_that_logs_them() -> None:
    plain = sql.cursor_for(connection)
    with CaptureQueriesContext(connection) as captured:
        assert sql.cursor_for(connection) is not plain
        assert _one(4) == 4
    assert [query["sql"] for query in captured.captured_queries] == ["SELECT 4"]
    assert sql.cursor_for(connection) is not plain  # and back to a plain one after


def test_a_health_check_due_gets_a_new_cursor(monkeypatch: pytest.MonkeyPatch) -> None:
    conn = connections[DEFAULT_DB_ALIAS]  # monkeypatch restores the wrapper's own attributes
    kept = sql.cursor_for(conn)
    monkeypatch.setattr(conn, "health_check_enabled", True)
    monkeypatch.setattr(conn, "health_check_done", False)
    assert sql.cursor_for(conn) is not kept
    assert conn.health_check_done  # made by conn.cursor(), which checked


def test_another_time_zone_gets_a_new_cursor(monkeypatch: pytest.MonkeyPatch) -> None:
    conn = connections[DEFAULT_DB_ALIAS]
    kept = sql.cursor_for(conn)
    monkeypatch.setitem(conn.__dict__, "timezone", zoneinfo.ZoneInfo("Europe/Paris"))
    assert sql.cursor_for(conn) is not kept


def test_a_statement_keeps_its_cursor_and_psycopg_s_adapters_between_other_statements() -> None:
    by_number, by_text = "SELECT %s::int", "SELECT %s::text"
    cursor = sql.cursor_for(connection, by_number)
    cursor.execute(by_number, [1])
    adapters = cursor.cursor._tx  # psycopg's Transformer: the dumpers and loaders it found
    other = sql.cursor_for(connection, by_text)
    other.execute(by_text, ["x"])

    again = sql.cursor_for(connection, by_number)
    again.execute(by_number, [2])

    assert again is cursor and other is not cursor
    assert again.cursor._tx is adapters
    assert (again.fetchone(), other.fetchone()) == ((2,), ("x",))


def test_statements_made_anew_each_time_do_not_pile_up_cursors() -> None:
    for number in range(sql._MAX_KEPT_CURSORS * 2):
        statement = f"SELECT {number}"
        cursor = sql.cursor_for(connection, statement)
        cursor.execute(statement)
        assert cursor.fetchone() == (number,)
    assert len(connection._kept_cursors[3]) <= sql._MAX_KEPT_CURSORS
_TIMES = (
    "SELECT now(), '2026-01-01 10:00:00.123456+00'::timestamptz,"
    " '1999-12-31 23:59:59.999999-05'::timestamptz, '0001-01-01 00:00:00+00'::timestamptz,"
    " '9999-12-31 23:59:59.999999+00'::timestamptz, NULL::timestamptz,"
    " ARRAY['2026-06-01 12:00:00+02'::timestamptz]"
)


def test_the_kept_cursor_reads_timestamps_as_djangos_cursor_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with connection.cursor() as cursor:
        cursor.execute(_TIMES)
        expected = cursor.fetchone()
    loaded: list[object] = []
    original = psycopg_any.BaseTzLoader.load
    monkeypatch.setattr(
        psycopg_any.BaseTzLoader,
        "load",
        lambda self, data: loaded.append(data) or original(self, data),
    )
    kept = sql.cursor_for(connection)
    kept.execute(_TIMES)
    got = kept.fetchone()
    assert got[1:] == expected[1:]
    assert [type(value) for value in got] == [type(value) for value in expected]
    tzinfos = [value.tzinfo for value in (*got[:5], *got[6]) if value is not None]
    assert all(tzinfo is datetime.UTC for tzinfo in tzinfos)
    # psycopg's C loader, not Django's Python one (about 5 µs a value): none went through it.
    assert loaded == []


def test_a_time_zone_other_than_utc_keeps_djangos_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    conn = connections[DEFAULT_DB_ALIAS]
    monkeypatch.setitem(conn.__dict__, "timezone", zoneinfo.ZoneInfo("Europe/Paris"))
    kept = sql.cursor_for(conn)
    kept.execute("SELECT '2026-01-01 10:00:00+00'::timestamptz")
    (value,) = kept.fetchone()
    assert value.tzinfo == zoneinfo.ZoneInfo("Europe/Paris")  # as Django's loader makes it


@pytest.mark.django_db(transaction=True)
def test_a_connection_closed_and_opened_again_by_the_kept_cursor_gets_a_new_cursor() -> None:
    # The first cursor_for of a closed connection opens it: its cursors must be the new
    # connection's, or the next close leaves them on a closed one that matches "None".
    connection.close()
    assert _one(5) == 5
    connection.close()
    assert _one(6) == 6
