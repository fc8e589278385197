"""runs/pipeline.py: writes queued in a block go to PostgreSQL in one round trip, in order,
each row count checked, and nothing a statement reads is missing (issue 12, the click)."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction

from runs import pipeline

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def table():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE pipeline_t (id int PRIMARY KEY, v int NOT NULL)")
        cursor.execute("INSERT INTO pipeline_t VALUES (1, 0), (2, 0)")
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE pipeline_t")


def rows() -> list[tuple[int, int]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, v FROM pipeline_t ORDER BY id")
        return cursor.fetchall()


def queued() -> int:
    return len(getattr(connection, "_queued_writes", None) or [])


UPDATE = "UPDATE pipeline_t SET v = v + %s WHERE id = %s"


def test_the_writes_wait_for_the_block_and_go_in_one_round_trip(table) -> None:
    sent: list[bool] = []

    def record(execute, sql, params, many, context):
        sent.append(pipeline.sending_together())
        return execute(sql, params, many, context)

    with transaction.atomic(), pipeline.writes_together():
        pipeline.write(connection, UPDATE, [1, 1], rows=1)
        pipeline.write(connection, UPDATE, [10, 2], rows=1)
        pipeline.write(connection, "INSERT INTO pipeline_t VALUES (%s, %s)", [3, 7])
        assert queued() == 3
        with connection.execute_wrapper(record):
            pass  # nothing sent yet: the wrapper sees no statement
        assert sent == []
    assert rows() == [(1, 1), (2, 10), (3, 7)]


def test_a_statement_in_the_block_reads_what_was_queued_before_it(table) -> None:
    with transaction.atomic(), pipeline.writes_together():
        pipeline.write(connection, UPDATE, [5, 1], rows=1)
        assert rows() == [(1, 5), (2, 0)]  # the queued write went first
        assert queued() == 0
        pipeline.write(connection, UPDATE, [1, 1], rows=1)
    assert rows() == [(1, 6), (2, 0)]


def test_a_row_count_other_than_the_one_expected_fails_the_block(table) -> None:
    failing = pytest.raises(DatabaseError, match="gone")
    with failing, transaction.atomic(), pipeline.writes_together():
        pipeline.write(connection, UPDATE, [1, 1], rows=1)
        pipeline.write(connection, UPDATE, [1, 99], rows=1, error="row 99 is gone")
    assert rows() == [(1, 0), (2, 0)]  # the transaction rolled back


def test_an_error_leaving_the_block_is_the_one_raised_and_the_writes_roll_back(table) -> None:
    with pytest.raises(ValueError), transaction.atomic(), pipeline.writes_together():
        pipeline.write(connection, UPDATE, [1, 1], rows=1)
        # a write the server refuses, then the caller's own error
        pipeline.write(connection, "INSERT INTO pipeline_t VALUES (%s, %s)", [1, 0])
        raise ValueError("the caller's")
    assert rows() == [(1, 0), (2, 0)]


def test_writes_caught_in_a_savepoint_keep_their_order(table) -> None:
    with transaction.atomic(), pipeline.writes_together():
        pipeline.write(connection, UPDATE, [1, 1], rows=1)
        try:
            with transaction.atomic():  # its SAVEPOINT sends the queued write first
                pipeline.write(connection, UPDATE, [100, 2], rows=1)
                raise RuntimeError
        except RuntimeError:
            pass  # ROLLBACK TO SAVEPOINT: after the queued write, which it undoes
        pipeline.write(connection, UPDATE, [1, 1], rows=1)
    assert rows() == [(1, 2), (2, 0)]


def test_outside_a_block_a_write_runs_at_once(table) -> None:
    with transaction.atomic():
        pipeline.write(connection, UPDATE, [3, 2], rows=1)
        assert rows() == [(1, 0), (2, 3)]
        with pytest.raises(DatabaseError, match="changed 0 rows"):
            pipeline.write(connection, UPDATE, [3, 42], rows=1)


def test_a_block_outside_a_transaction_is_refused(table) -> None:
    with pytest.raises(RuntimeError, match="inside a transaction"), pipeline.writes_together():
        pass


def test_the_servers_refusal_is_djangos_error_as_without_the_block(table) -> None:
    with pytest.raises(IntegrityError), transaction.atomic(), pipeline.writes_together():
        pipeline.write(connection, UPDATE, [1, 1], rows=1)
        pipeline.write(connection, "INSERT INTO pipeline_t VALUES (%s, %s)", [2, 0])
    assert rows() == [(1, 0), (2, 0)]


def test_the_statement_that_finds_writes_queued_takes_them_in_its_round_trip(table) -> None:
    piped: list[bool] = []

    def record(execute, sql, params, many, context):
        piped.append(pipeline.sending_together())
        return execute(sql, params, many, context)

    with transaction.atomic(), pipeline.writes_together():
        pipeline.write(connection, UPDATE, [2, 1], rows=1)
        pipeline.write(connection, UPDATE, [3, 2], rows=1)
        with connection.execute_wrapper(record), connection.cursor() as cursor:
            cursor.execute("SELECT id, v FROM pipeline_t WHERE v > %s ORDER BY id", [0])
            assert cursor.fetchall() == [(1, 2), (2, 3)]
            assert cursor.rowcount == 2
    # The two writes and the SELECT, each seen by the recorder, all sent in the one pipeline.
    assert piped == [True, True, True]


def test_a_write_the_server_refuses_fails_the_statement_that_took_it(table) -> None:
    failing = pytest.raises(DatabaseError, match="gone")
    with failing, transaction.atomic(), pipeline.writes_together():
        pipeline.write(connection, UPDATE, [1, 99], rows=1, error="row 99 is gone")
        rows()  # the read that took the write along raises its failed row count


def test_a_block_whose_writes_a_read_took_ends_without_another_round_trip(
    table, monkeypatch: pytest.MonkeyPatch
) -> None:
    with transaction.atomic():
        entered: list[bool] = []
        pg = connection.connection
        monkeypatch.setattr(pg, "pipeline", lambda: entered.append(True) or type(pg).pipeline(pg))
        with pipeline.writes_together():
            pipeline.write(connection, UPDATE, [1, 1], rows=1)
            assert rows() == [(1, 1), (2, 0)]  # the read took the write: one pipeline
        with pipeline.writes_together():
            pass  # nothing written: no pipeline at all
    assert entered == [True]


INSERT = "INSERT INTO pipeline_t VALUES (%s, %s)"


@pytest.mark.parametrize(
    "failing",
    [(INSERT, [1, 0], None), (UPDATE, [1, 99], 1)],
    ids=["refused by the server", "a row count other than expected"],
)
def test_a_queued_write_failing_at_a_savepoint_is_not_caught_as_the_savepoint_s(
    table, failing
) -> None:
    # The SAVEPOINT takes the queued writes along; a handler of the savepoint's own errors
    # must not carry the transaction on to a COMMIT (which the server turns into a rollback
    # after on_commit ran) or to committing a write whose row count failed.
    statement, params, count = failing
    committed: list[bool] = []
    with transaction.atomic():
        transaction.on_commit(lambda: committed.append(True))
        with pipeline.writes_together():
            pipeline.write(connection, UPDATE, [1, 1], rows=1)
            pipeline.write(connection, statement, params, rows=count)
            with pytest.raises(DatabaseError), transaction.atomic():  # the SAVEPOINT raises
                pipeline.write(connection, UPDATE, [1, 2], rows=1)
    assert committed == []
    assert rows() == [(1, 0), (2, 0)]


def test_a_write_failing_under_the_exception_leaving_the_block_rolls_the_transaction_back(
    table,
) -> None:
    committed: list[bool] = []
    with transaction.atomic():
        transaction.on_commit(lambda: committed.append(True))
        with pytest.raises(ValueError), pipeline.writes_together():
            pipeline.write(connection, UPDATE, [1, 1], rows=1)
            pipeline.write(connection, UPDATE, [1, 99], rows=1)
            raise ValueError("the caller's, which it catches")
    assert committed == []
    assert rows() == [(1, 0), (2, 0)]
