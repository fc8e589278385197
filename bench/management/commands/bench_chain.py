"""Benchmark the two log checks on a large event log: `verify_event_chain` and
`rebuild_projections --verify`.

    python manage.py bench_chain --events 200000 --database countersign_bench_chain

Creates the database (on the server of DATABASE_URL; one this command did not create is
refused, never dropped), migrates it, seeds about `--events` events (bench/chain_seed.py),
then runs each check in a fresh child process and prints events per second (wall time) and
the child's peak resident memory (VmHWM from /proc/self/status) and CPU time. With
--reuse-db an existing benchmark database is measured again without seeding.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from bench import pgstats

MARK = "countersign bench_chain"
CHECKS = {
    "verify_event_chain": ("verify_event_chain",),
    "rebuild_projections --verify": ("rebuild_projections", "--verify"),
}


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Command(BaseCommand):
    help = "Seed a large event log and measure verify_event_chain and rebuild_projections."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--events", type=int, default=200_000)
        parser.add_argument("--database", default="countersign_bench_chain")
        parser.add_argument("--reuse-db", action="store_true", help="measure it again as it is")
        parser.add_argument(
            "--only", choices=list(CHECKS), help="measure this check only (default: both)"
        )
        parser.add_argument("--inner", choices=["seed", *CHECKS], help="(internal)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["inner"]:
            self._inner(options)
            return
        url = os.environ.get("DATABASE_URL", "")
        if urlsplit(url).scheme not in ("postgres", "postgresql"):
            raise CommandError("bench_chain runs on PostgreSQL: set DATABASE_URL=postgres://…")
        bench_url = pgstats.with_database(url, options["database"])
        env = {**os.environ, "DATABASE_URL": bench_url}
        if not options["reuse_db"]:
            self._create_database(url, options["database"])
            self._child(env, "migrate", "--verbosity", "0")
            seeded = self._inner_child(env, "seed", options)
            self.stdout.write(
                f"seeded {seeded['events']} events in {seeded['seconds']:.1f} s "
                f"({options['database']})"
            )
        for name in [options["only"]] if options["only"] else CHECKS:
            result = self._inner_child(env, name, options)
            events, wall = result["events"], result["seconds"]
            own, db = result["cpu_seconds"], result["db_cpu_seconds"]
            self.stdout.write(
                f"{name:30} {events:>9} events  wall {wall:7.2f} s ({events / wall:>8,.0f}/s)  "
                f"CPU {own:6.2f} s + PostgreSQL {db:5.2f} s "
                f"({events / (own + db):>8,.0f} events per CPU second)  "
                f"peak RSS {result['peak_rss_mib']:6.1f} MiB\n{'':30} {result['verdict']}"
            )

    def _create_database(self, url: str, name: str) -> None:
        with psycopg.connect(pgstats.admin_conninfo(url), autocommit=True) as conn:
            row = conn.execute(
                "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
                [name],
            ).fetchone()
            if row is not None:
                if row[0] != MARK:
                    raise CommandError(
                        f"Database {name} exists and is not bench_chain's: pick another --database."
                    )
                conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
            conn.execute(f"COMMENT ON DATABASE \"{name}\" IS '{MARK}'")

    def _child(self, env: dict[str, str], *argv: str) -> str:
        done = subprocess.run(
            [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), *argv],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            raise CommandError(f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def _inner_child(self, env: dict[str, str], inner: str, options: dict) -> dict[str, Any]:
        out = self._child(env, "bench_chain", "--inner", inner, "--events", str(options["events"]))
        return json.loads(out.strip().splitlines()[-1])

    def _inner(self, options: dict[str, Any]) -> None:
        from runs.models import Event

        backend = _backend_pid()
        backend_cpu = _process_cpu(backend)
        started, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        if options["inner"] == "seed":
            from bench.chain_seed import seed

            events, verdict = seed(options["events"]), "seeded"
        else:
            out = _Sink()
            try:
                call_command(*CHECKS[options["inner"]], stdout=out)
                verdict = out.last
            except CommandError as exc:
                verdict = f"FAILED: {exc}"
            events = Event.objects.count()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        seconds = time.perf_counter() - started
        result = {
            "events": events,
            "seconds": seconds,
            "cpu_seconds": usage.ru_utime + usage.ru_stime - cpu.ru_utime - cpu.ru_stime,
            # The PostgreSQL backend serving this process, on the same machine.
            "db_cpu_seconds": _process_cpu(backend) - backend_cpu,
            "peak_rss_mib": peak_rss_mib(),
            "verdict": verdict[:100],
        }
        self.stdout.write(json.dumps(result))


def _backend_pid() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _process_cpu(pid: int) -> float:
    """User + system CPU seconds of a process on this machine (0 when it is not here)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Sink:
    """Keeps the last line a check wrote (its OK line), not the whole output."""

    def __init__(self) -> None:
        self.last = ""

    def write(self, text: str) -> None:
        if text.strip():
            self.last = text.strip()

    def flush(self) -> None:
        pass
