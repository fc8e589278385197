"""Seed a database with a million events and measure every console page against it.

    python manage.py bench_pages --database countersign_pages

Makes template runs through the real services against a sandbox it starts, clones them by COPY
(`bench/pages_seed.py`: 10,000 pending approvals, ~100,000 tool calls, 1,000,000 events across
3 tenants by default) and prints each page's server time (p50/p95 over `--repeat` requests),
queries and size (`bench/pages_measure.py`).

It works only in the database named by `--database`, on the server of DATABASE_URL. It creates
that database when it does not exist (and marks it as its own); it refuses to seed into one
that already holds runs unless `--measure-only` (measure what is there) or `--add-data`. It
never drops a database and never touches Redis: Celery's broker is in memory in its child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from bench import pgstats
from bench.procs import start_sandbox

ROOT = Path(settings.BASE_DIR)
MARKER = "countersign bench_pages"


class Command(BaseCommand):
    help = "Seed a database with a million events and measure each console page."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--database", required=True, help="the database to seed and use")
        parser.add_argument("--events", type=int, default=1_000_000)
        parser.add_argument("--approvals", type=int, default=10_000, help="pending approvals")
        parser.add_argument("--repeat", type=int, default=20, help="requests per page")
        parser.add_argument("--measure-only", action="store_true", help="seed nothing")
        parser.add_argument(
            "--profile", metavar="PAGE", help="profile one page (e.g. 'run page'), seed nothing"
        )
        parser.add_argument(
            "--explain",
            action="store_true",
            help="PostgreSQL's time for each page's statements (EXPLAIN ANALYZE), seed nothing",
        )
        parser.add_argument(
            "--add-data", action="store_true", help="seed even if the database holds runs"
        )
        parser.add_argument("--inner", choices=["seed", "measure"], help="(internal)")
        parser.add_argument("--inner-file", help="(internal)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["inner"]:
            self._inner(options)
            return
        url = os.environ.get("DATABASE_URL", "")
        if urlsplit(url).scheme not in ("postgres", "postgresql", "pgsql"):
            raise CommandError("bench_pages runs on PostgreSQL: set DATABASE_URL=postgres://…")
        name = options["database"]
        target = pgstats.with_database(url, name)
        if pgstats.database_comment(url, name) is None:
            pgstats.create_marked_database(url, name, MARKER)
            self.stdout.write(f"Created the database {name}.")
        env = {
            **os.environ,
            "DATABASE_URL": target,
            "DJANGO_SETTINGS_MODULE": "config.settings.base",
            # Nothing here needs a broker: outbox messages stay unpublished, Redis untouched.
            "CELERY_BROKER_URL": "memory://localhost/",
            "DATABASE_STATEMENT_TIMEOUT": "0",
            "LOG_LEVEL": "WARNING",
            "DJANGO_ALLOWED_HOSTS": "testserver",  # the in-process test client's host
        }
        self._run(["migrate", "--noinput", "-v", "0"], env)
        runs = _count_runs(target)
        if not (options["measure_only"] or options["profile"] or options["explain"]):
            if runs and not options["add_data"]:
                raise CommandError(
                    f"The database {name} already holds {runs} runs: pass --measure-only to "
                    "measure them, or --add-data to seed more into it."
                )
            self._seed(options, env)
        self._run(
            [
                "bench_pages",
                "--database",
                name,
                "--inner",
                "measure",
                "--repeat",
                str(options["repeat"]),
                *(["--profile", options["profile"]] if options["profile"] else []),
                *(["--explain"] if options["explain"] else []),
            ],
            env,
        )

    def _seed(self, options: dict[str, Any], env: dict[str, str]) -> None:
        with tempfile.TemporaryDirectory(prefix="bench-pages-") as tmp:
            sandbox, sandbox_url = start_sandbox(
                ROOT,
                env,
                Path(tmp) / "sandbox",
                Path(tmp),
                extra=["--extra-tenant", "initech"],
            )
            try:
                spec = Path(tmp) / "spec.json"
                spec.write_text(json.dumps({k: options[k] for k in ("events", "approvals")}))
                self._run(
                    [
                        "bench_pages",
                        "--database",
                        options["database"],
                        "--inner",
                        "seed",
                        "--inner-file",
                        str(spec),
                    ],
                    {**env, "SANDBOX_URL": sandbox_url},
                )
            finally:
                sandbox.stop()

    def _run(self, argv: list[str], env: dict[str, str]) -> None:
        command = [sys.executable, str(ROOT / "manage.py"), *argv]
        if subprocess.run(command, env=env, cwd=ROOT).returncode != 0:
            raise CommandError(f"{' '.join(argv[:1])} failed; see above.")

    def _inner(self, options: dict[str, Any]) -> None:
        if settings.DATABASES["default"]["NAME"] != options["database"]:
            raise CommandError("--inner runs only against the database it was given.")
        if options["inner"] == "seed":
            self._inner_seed(json.loads(Path(options["inner_file"]).read_text()))
        else:
            self._inner_measure(options["repeat"], options["profile"], options["explain"])

    def _inner_seed(self, spec: dict[str, int]) -> None:
        from approvals import latency
        from bench import pages_seed

        started = time.monotonic()
        templates = pages_seed.make_templates(settings.SANDBOX_URL)
        for template in templates:
            calls = len(template.rows["toolcalls_toolcall"][1])
            self.stdout.write(
                f"template {template.kind:7} {template.tenant.slug:8} {template.run_id}: "
                f"{calls} calls, {len(template.events)} events"
            )
        plan = pages_seed.plan_for(templates, spec["events"], spec["approvals"])
        self.stdout.write(
            f"cloning {plan.busy_per_tenant} busy and {plan.pending_per_tenant} pending runs "
            "per tenant"
        )
        pages_seed.clone_all(templates, plan, echo=self.stdout.write)
        # COPY skips the deciding transactions that count approval latency: count the cloned
        # decisions from the log, as the counts' migration did (else --verify differs).
        latency.rebuild()
        _analyze()
        self.stdout.write(
            f"seeded in {time.monotonic() - started:.0f} s (this process's CPU "
            f"{time.process_time():.0f} s): {pages_seed.counts()}"
        )

    def _inner_measure(self, repeat: int, profile: str | None, explain: bool) -> None:
        from bench import pages_explain, pages_measure, pages_profile, pages_seed
        from runs.models import User

        self.stdout.write(f"data: {pages_seed.counts()}")
        self.stdout.write(f"machine: {_machine()}; load average {os.getloadavg()}")
        admin = User.objects.filter(username="olivia").first()
        if admin is None:
            raise CommandError("no bench admin (olivia) in this database: seed it first.")
        if profile:
            pages_profile.profile_page(admin, profile, repeat, self.stdout.write)
            return
        if explain:
            pages_explain.explain_all(admin, self.stdout.write, plans=True)
            return
        pages_measure.measure_all(admin, repeat, self.stdout.write)


def _analyze() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        # Fresh statistics and visibility maps, as autovacuum would leave them after a while.
        cursor.execute("VACUUM ANALYZE")


def _count_runs(url: str) -> int:
    with psycopg.connect(pgstats.conninfo(url)) as conn:
        return conn.execute("SELECT count(*) FROM runs_run").fetchone()[0]


def _machine() -> str:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    return f"{os.cpu_count()} CPUs, {model}"
