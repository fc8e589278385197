"""Run the whole system under faults and print one table of invariants (issue #10).

    python manage.py soak                      # about 10 minutes here
    python manage.py soak --minutes 60 --workers 8 --pg-restart-cmd "pg_ctlcluster 16 main restart"
    python manage.py soak --quick              # a minute of faults, for development

It starts its own sandbox, web server (gunicorn), worker processes and beat against
PostgreSQL and Redis, and drives tenants' agents (refunds and spare-part replacements) over
the API and their approvers through the console's pages, while it kills and pauses workers,
loses requests and answers at the external systems, delivers tasks twice, restarts Redis and
cuts the database's connections. Then it waits for quiescence and prints what held; the exit
status is non-zero when an invariant failed.

It touches nothing it did not create. Its database (`--database`, default countersign_soak)
is made on the server of DATABASE_URL and marked as the soak's; a database of that name
without the mark is refused, never dropped. Redis is a redis-server of its own on a free
port (restarting it harms nobody), or with `--broker-url` an empty Redis database, which it
then never restarts. The work happens in this command run again with that environment
(`--inner`), so no setting of the caller's can point it at other data.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from bench import pgstats
from bench.procs import free_port

DEFAULT_MINUTES = 8.0
MARK = "created by manage.py soak (it drops and creates it again on its next run)"
# The flags the inner run is given again, as they were parsed.
PASSED_ON = (
    "minutes",
    "workers",
    "tenants",
    "agents",
    "pool",
    "concurrency",
    "pauses",
    "redis_restarts",
    "db_cuts",
    "pg_restart_cmd",
    "approval_expiry",
    "settle_minutes",
    "think",
    "seed",
    "database",
)


class Command(BaseCommand):
    help = "Run the system under faults and print a table of invariants (about 10 minutes)."

    def add_arguments(self, parser: CommandParser) -> None:
        add = parser.add_argument
        add("--minutes", type=float, default=DEFAULT_MINUTES, help="of load and faults (8)")
        add("--workers", type=int, default=4, help="celery worker processes (default 4)")
        add("--tenants", type=int, default=3, help="tenants, each with its agents (default 3)")
        add("--agents", type=int, default=2, help="agents per tenant (default 2)")
        add("--pool", default="prefork", choices=["prefork", "threads"])
        add("--concurrency", type=int, default=2, help="per worker process (default 2)")
        add("--pauses", type=int, help="SIGSTOPs past the lease (20 per 8 minutes)")
        add("--redis-restarts", type=int, default=2)
        add("--db-cuts", type=int, default=2, help="terminations of every database connection")
        add("--pg-restart-cmd", default="", help="also restart PostgreSQL this way, as often")
        add("--approval-expiry", type=int, default=30, help="seconds, for approvals left alone")
        add("--settle-minutes", type=float, default=5.0, help="longest wait for quiescence")
        add("--think", type=float, default=0.5, help="seconds an agent waits between requests")
        add("--seed", type=int, default=1, help="of the random faults and load")
        add("--database", default="countersign_soak", help="its own database (see above)")
        add("--broker-url", default="", help="an empty Redis database instead of its own server")
        add("--quick", action="store_true", help="1 minute, 2 tenants, 2 workers, fewer faults")
        add("--keep-logs", action="store_true", help="keep the processes' logs and print where")
        add("--drop-database", action="store_true", help="drop its database when done")
        add("--inner", choices=["private", "external"], help="(internal: the run itself)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["quick"]:
            options.update(minutes=1.0, tenants=2, workers=2, agents=1, redis_restarts=1)
            options.update(db_cuts=1, pauses=options["pauses"] or 3)
        if options["pauses"] is None:
            options["pauses"] = max(1, round(20 * options["minutes"] / DEFAULT_MINUTES))
        if options["inner"]:
            self.inner(options)
            return
        if options["minutes"] <= 0 or min(options["workers"], options["tenants"]) < 1:
            raise CommandError("--minutes, --workers and --tenants must be positive.")
        database_url = database_of(options["database"])
        broker, mode = broker_of(options["broker_url"])
        prepare_database(database_url, options["database"])
        env = {**os.environ, "DATABASE_URL": database_url, "CELERY_BROKER_URL": broker}
        # Its own checks (replaying the log) may run longer than a request may.
        env.update(DJANGO_SETTINGS_MODULE="config.settings.base", DATABASE_STATEMENT_TIMEOUT="0")
        argv = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "soak"]
        argv += inner_arguments(options, mode)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, argv, env)

    def inner(self, options: dict[str, Any]) -> None:
        from bench.soak import Soak

        name = settings.DATABASES["default"]["NAME"]
        if (
            name != options["database"]
            or pgstats.database_comment(os.environ["DATABASE_URL"], name) != MARK
        ):
            raise CommandError(f"--inner runs only on the soak's own database, not {name}.")
        if not Soak(self, options).run():
            raise CommandError("an invariant failed; see the table above.")


def database_of(name: str) -> str:
    url = os.environ.get("DATABASE_URL", "")
    if urlsplit(url).scheme not in ("postgres", "postgresql", "pgsql"):
        raise CommandError(
            "soak runs on PostgreSQL, not SQLite: set DATABASE_URL=postgres://user@host:5432/db "
            f"(now {url or 'unset'}); it creates its own database {name} on that server."
        )
    return pgstats.with_database(url, name)


def broker_of(url: str) -> tuple[str, str]:
    """(broker URL, "private" or "external")."""
    if url:
        if urlsplit(url).scheme != "redis":
            raise CommandError(f"--broker-url must be a Redis database (redis://...), not {url}.")
        try:
            size = redis.Redis.from_url(url, socket_timeout=5).dbsize()
        except redis.exceptions.RedisError as exc:
            raise CommandError(f"Redis at --broker-url does not answer: {exc}") from exc
        if size:
            raise CommandError(
                f"Redis database {url} holds {size} keys: soak never empties what it did not "
                "create. Name an empty database, or leave --broker-url out."
            )
        return url, "external"
    if not shutil.which("redis-server"):
        raise CommandError(
            "soak starts a redis-server of its own (so that restarting it harms nobody), and "
            "there is none on PATH: install it (apt-get install redis-server), or name an "
            "empty Redis database with --broker-url redis://host:6379/N. The in-memory "
            "broker cannot show what the soak is meant to show."
        )
    return f"redis://127.0.0.1:{free_port()}/0", "private"


def prepare_database(url: str, name: str) -> None:
    comment = pgstats.database_comment(url, name)
    if comment is not None and comment != MARK:
        raise CommandError(
            f"A database {name} exists and soak did not create it: it is left alone. "
            "Name another with --database."
        )
    if comment is not None:
        pgstats.drop_database(url, name)
    pgstats.create_marked_database(url, name, MARK)


def inner_arguments(options: dict[str, Any], mode: str) -> list[str]:
    argv = []
    for key in PASSED_ON:
        value = options[key]
        if value not in (None, ""):
            argv.append(f"--{key.replace('_', '-')}={value}")
    for flag in ("keep_logs", "drop_database"):
        if options[flag]:
            argv.append(f"--{flag.replace('_', '-')}")
    argv.append(f"--verbosity={options['verbosity']}")
    return [*argv, f"--inner={mode}"]
