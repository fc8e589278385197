"""bench_dispatch empties only what it made: its marked databases, its marked Redis database."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis
from django.core.management.base import CommandError

from bench import pgstats
from bench.management.commands.bench_dispatch import MARK, REDIS_MARK, claim_redis, own_database

URL = os.environ.get("DATABASE_URL", "")


@pytest.fixture
def database_name() -> Iterator[str]:
    if not URL.startswith("postgres"):
        pytest.fail("this test needs DATABASE_URL=postgres://…")
    name = f"{pgstats.database_name(URL)}_bench_ownership"
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


def test_it_creates_a_missing_database_with_its_mark(database_name: str) -> None:
    own_database(URL, database_name, recreate=False)

    assert pgstats.database_comment(URL, database_name) == MARK


def test_it_never_touches_a_database_it_did_not_make(database_name: str) -> None:
    pgstats.create_marked_database(URL, database_name, "someone else's")

    with pytest.raises(CommandError, match="did not create it"):
        own_database(URL, database_name, recreate=True)
    assert pgstats.database_comment(URL, database_name) == "someone else's"


def test_it_drops_its_own_database_only_with_recreate(database_name: str) -> None:
    own_database(URL, database_name, recreate=False)
    with pgstats.psycopg.connect(pgstats.conninfo(pgstats.with_database(URL, database_name))) as c:
        c.execute("CREATE TABLE kept (id int)")

    own_database(URL, database_name, recreate=False)
    assert _has_table(database_name, "kept")
    own_database(URL, database_name, recreate=True)
    assert not _has_table(database_name, "kept")


def test_it_refuses_a_redis_database_holding_someone_elses_keys(redis_url: str) -> None:
    redis.Redis.from_url(redis_url).set("theirs", "1")

    with pytest.raises(CommandError, match="no mark of bench_dispatch"):
        claim_redis(redis_url)
    assert redis.Redis.from_url(redis_url).get("theirs") == b"1"


def test_it_empties_an_empty_or_marked_redis_database(redis_url: str) -> None:
    claim_redis(redis_url)
    client = redis.Redis.from_url(redis_url)
    client.set("left by the last run", "1")

    claim_redis(redis_url)
    assert client.keys() == [REDIS_MARK.encode()]


def _has_table(database: str, table: str) -> bool:
    with pgstats.psycopg.connect(pgstats.conninfo(pgstats.with_database(URL, database))) as c:
        return c.execute("SELECT to_regclass(%s) IS NOT NULL", [table]).fetchone()[0]
