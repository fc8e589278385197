"""bench_approve empties only what it made: its marked database, its marked Redis database; a
bench_dispatch database is not its own either. And it keeps its own database analyzed."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError

from bench import pgstats
from bench.management.commands import bench_approve, bench_dispatch
from bench.management.commands.bench_approve import MARK, REDIS_MARK, claim_redis, own_database

URL = os.environ.get("DATABASE_URL", "")


@pytest.fixture
def database_name() -> Iterator[str]:
    if not URL.startswith("postgres"):
        pytest.fail("this test needs DATABASE_URL=postgres://…")
    name = f"{pgstats.database_name(URL)}_bench_approve_ownership"
    pgstats.drop_database(URL, name)
    yield name
    pgstats.drop_database(URL, name)


@pytest.fixture
def redis_url() -> Iterator[str]:
    # The Redis database the tests were given (never another one), emptied before and after.
    url = os.environ.get("CELERY_BROKER_URL", "")
    if not url.startswith("redis"):
        pytest.fail("this test needs CELERY_BROKER_URL=redis://…")
    redis.Redis.from_url(url).flushdb()
    yield url
    redis.Redis.from_url(url).flushdb()


@pytest.mark.parametrize("comment", ["someone else's", bench_dispatch.MARK])
def test_it_never_touches_a_database_it_did_not_make(database_name: str, comment: str) -> None:
    pgstats.create_marked_database(URL, database_name, comment)

    with pytest.raises(CommandError, match="bench_approve did not create it"):
        own_database(URL, database_name, recreate=True)
    assert pgstats.database_comment(URL, database_name) == comment


def test_the_command_refuses_a_foreign_database_before_anything_else(
    database_name: str, redis_url: str
) -> None:
    pgstats.create_marked_database(URL, database_name, "someone else's")
    redis.Redis.from_url(redis_url).set("theirs", "1")
    db = int(redis_url.rsplit("/", 1)[1] or 0)

    with pytest.raises(CommandError, match="did not create it"):
        call_command("bench_approve", "--database", database_name, "--redis-db", str(db))
    assert pgstats.database_comment(URL, database_name) == "someone else's"
    assert redis.Redis.from_url(redis_url).get("theirs") == b"1"


def test_it_creates_a_missing_database_with_its_mark(database_name: str) -> None:
    own_database(URL, database_name, recreate=False)

    assert pgstats.database_comment(URL, database_name) == MARK


def test_it_refuses_a_redis_database_holding_someone_elses_keys(redis_url: str) -> None:
    redis.Redis.from_url(redis_url).set("theirs", "1")

    with pytest.raises(CommandError, match="no mark of bench_approve"):
        claim_redis(redis_url)
    assert redis.Redis.from_url(redis_url).get("theirs") == b"1"


def test_it_empties_an_empty_or_marked_redis_database(redis_url: str) -> None:
    claim_redis(redis_url)
    client = redis.Redis.from_url(redis_url)
    client.set("left by the last run", "1")

    claim_redis(redis_url)
    assert client.keys() == [REDIS_MARK.encode()]


def test_the_inner_phases_refuse_a_database_the_benchmark_did_not_make(tmp_path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text("{}")
    with pytest.raises(CommandError, match="only on a database bench_approve made"):
        call_command(
            "bench_approve",
            "--inner",
            "setup",
            "--inner-file",
            str(spec),
            "--database",
            "x",
            "--redis-db",
            "0",
        )


def test_its_maintenance_runs_on_its_own_database(database_name: str) -> None:
    """With the server's autovacuum off (CI's settings), nothing else would ever analyze the
    benchmark's new database: its plans would be chosen without statistics. (What the pass
    analyzes: tests/test_bench_pgstats.py.)"""
    own_database(URL, database_name, recreate=False)
    command = bench_approve.Command()
    parser = command.create_parser("manage.py", "bench_approve")
    opts = vars(parser.parse_args(["--database", database_name, "--redis-db", "0"]))
    bench = bench_approve.Bench(command, opts, URL, "redis://127.0.0.1:6379/0")  # not used
    bench.start_maintenance()
    try:
        assert bench.analyzer is not None
        assert bench.analyzer.is_alive() or not bench.analyzer.off  # on: the server analyzes
        assert bench.analyzer.conn.info.dbname == database_name
    finally:
        bench.analyzer.stop()
