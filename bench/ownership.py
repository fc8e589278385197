"""What a benchmark may touch: only the databases and the Redis database it was given, and of
those only what it marked as its own. Shared by bench_dispatch and bench_approve, each with
its own mark, so neither ever drops or flushes the other's (or anyone else's) data."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import redis
from django.core.management.base import CommandError

from bench import pgstats


@dataclass(frozen=True)
class Owner:
    name: str  # the command's name: bench_dispatch, bench_approve

    @property
    def mark(self) -> str:
        return f"countersign {self.name}: may be dropped by {self.name} --recreate"

    @property
    def redis_mark(self) -> str:
        return f"countersign:{self.name}"

    def check_environment(self) -> tuple[str, str]:
        """DATABASE_URL (PostgreSQL) and CELERY_BROKER_URL (Redis), or a clear refusal."""
        database_url = os.environ.get("DATABASE_URL", "")
        broker_url = os.environ.get("CELERY_BROKER_URL", "")
        if urlsplit(database_url).scheme not in ("postgres", "postgresql", "pgsql"):
            raise CommandError(
                f"{self.name} runs on PostgreSQL: set DATABASE_URL=postgres://user@host:5432/db "
                f"(now {database_url or 'unset'}). It uses the database --database names there."
            )
        if urlsplit(broker_url).scheme != "redis":
            raise CommandError(
                f"{self.name} runs on Redis: set CELERY_BROKER_URL=redis://host:6379/0 "
                f"(now {broker_url or 'unset'}). It uses the database --redis-db names there."
            )
        return database_url, broker_url

    def refuse_foreign(self, url: str, name: str) -> str | None:
        """The database's comment (None: no such database); refuses one this benchmark did
        not make."""
        comment = pgstats.database_comment(url, name)
        if comment is not None and comment != self.mark:
            raise CommandError(
                f"A database {name} exists and {self.name} did not create it: it is left alone. "
                "Name another."
            )
        return comment

    def own_database(self, url: str, name: str, recreate: bool) -> None:
        """Create `name` with the mark; drop it first only if it carries the mark and
        --recreate asks for it. A database without the mark is never touched."""
        comment = self.refuse_foreign(url, name)
        if comment is None:
            pgstats.create_marked_database(url, name, self.mark)
        elif recreate:
            pgstats.drop_database(url, name)
            pgstats.create_marked_database(url, name, self.mark)

    def claim_redis(self, url: str) -> None:
        """Empty the Redis database we were given, but only when it is ours: empty, or marked
        by an earlier run. Anything else there belongs to someone else."""
        client = redis.Redis.from_url(url)
        size = client.dbsize()
        if size and not client.exists(self.redis_mark):
            raise CommandError(
                f"Redis database {url} holds {size} keys and no mark of {self.name}: it is left "
                "alone. Name an empty one with --redis-db."
            )
        client.flushdb()
        client.set(self.redis_mark, self.name)


def redis_db(url: str, db: int) -> str:
    """The broker's URL with another database number."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", "", ""))


def reexec_in(owner: Owner, database: str, redis_number: int) -> None:
    """Start this command again in a process whose settings name the benchmark's database and
    Redis database (claimed first), unless this process already is that one. For the
    commands that measure on a database bench_dispatch made (profile_dispatch,
    profile_propose)."""
    from django.conf import settings

    if settings.DATABASES["default"]["NAME"] == database:
        return
    broker = redis_db(os.environ.get("CELERY_BROKER_URL", ""), redis_number)
    owner.claim_redis(broker)
    url = pgstats.with_database(os.environ["DATABASE_URL"], database)
    env = {**os.environ, "DATABASE_URL": url}
    env.update(CELERY_BROKER_URL=broker, DJANGO_SETTINGS_MODULE="config.settings.base")
    env.update(DJANGO_DEBUG="0", LOG_LEVEL="WARNING")
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *sys.argv], env)
