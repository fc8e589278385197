"""runs/prefetch.py: a server-side cursor's rows fetched ahead by a thread, in order, with
the fetch's error raised in the caller's thread and the thread gone once closed."""

from __future__ import annotations

import threading
from contextlib import closing

import pytest
from django.db import DataError, connection, transaction

from runs.prefetch import prefetched


def _named_cursor(sql: str):
    cursor = connection.chunked_cursor()
    cursor.execute(sql)
    return cursor


def _fetchers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "prefetch"]


@pytest.mark.django_db
def test_it_gives_every_row_in_order_a_fetch_at_a_time() -> None:
    with transaction.atomic(), _named_cursor("SELECT g FROM generate_series(1, 10) g") as cursor:
        chunks = [[row[0] for row in rows] for rows in prefetched(cursor.fetchmany, 3)]
    assert chunks == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10]]
    assert _fetchers() == []


@pytest.mark.django_db
def test_closing_it_early_ends_the_thread() -> None:
    sql = "SELECT g FROM generate_series(1, 100000) g"
    with transaction.atomic(), _named_cursor(sql) as cursor:
        with closing(prefetched(cursor.fetchmany, 10, ahead=1)) as chunks:
            assert [row[0] for row in next(chunks)] == list(range(1, 11))
            assert len(_fetchers()) == 1  # fetching ahead, or waiting for room
        assert _fetchers() == []
        # The cursor is free again: the next rows are the ones the thread did not hand over.
        assert cursor.fetchmany(1)[0][0] > 10


@pytest.mark.django_db
def test_an_error_of_the_fetch_is_raised_to_the_caller() -> None:
    sql = "SELECT 1 / (5 - g) FROM generate_series(1, 10) g"
    # Django's cursor names psycopg's DivisionByZero its DataError.
    with pytest.raises(DataError, match="division by zero"):  # noqa: SIM117 - the order matters
        with transaction.atomic(), _named_cursor(sql) as cursor:
            list(prefetched(cursor.fetchmany, 2))
    assert _fetchers() == []
