"""Where a proposal's CPU goes: `tool_call_propose`, or the whole API request around it.

    python manage.py profile_propose --database countersign_bench --redis-db 2 --calls 400
    python manage.py profile_propose --database countersign_bench --redis-db 2 --via api

In one process, against a database that bench_dispatch made (its mark is checked): starts a
sandbox, adds one order per call, then proposes `--calls` refunds, as bench_dispatch's
proposer does (`--via service`) or as an agent does, POST /api/v1/runs/{id}/tool-calls with a
bearer key through Django's whole request handling in-process (`--via api`). The first
`--warmup` proposals are not counted (imports, caches, the first connection). Half of the
rest run bare, timed with the process's CPU clock (the figure: CPU ms per proposal, no
profiler), the other half under cProfile with the same clock (where the time goes). SQL
statements, and the CPU of the connection's PostgreSQL backend (/proc), are counted for every
proposal. The dispatch messages the proposals publish land
in the given Redis database, which is emptied before and after; no worker takes them.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from bench import pgstats
from bench.management.commands.bench_dispatch import MARK, OWNER, claim_redis
from bench.ownership import reexec_in
from bench.procs import start_sandbox
from bench.sandbox_http import add_orders


class Command(BaseCommand):
    help = "Profile proposals (the service, or the API request) with a CPU clock."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--database", required=True, help="a database bench_dispatch made")
        parser.add_argument("--redis-db", type=int, required=True)
        parser.add_argument("--calls", type=int, default=400)
        parser.add_argument("--warmup", type=int, default=20)
        parser.add_argument("--via", choices=("service", "api"), default="service")
        parser.add_argument("--top", type=int, default=25, help="functions listed per sort")
        parser.add_argument("--dump", help="write the raw profile to this file")

    def handle(self, *args: Any, **options: Any) -> None:
        url = os.environ.get("DATABASE_URL", "")
        if not url.startswith("postgres"):
            raise CommandError("set DATABASE_URL=postgres://… (the server of --database)")
        name = options["database"]
        if pgstats.database_comment(url, name) != MARK:
            raise CommandError(f"{name} is not a database bench_dispatch made: refused.")
        reexec_in(OWNER, name, options["redis_db"])
        self.profile(options)

    def profile(self, options: dict[str, Any]) -> None:
        from bench import driver

        total = options["warmup"] + options["calls"]
        tmp = Path(tempfile.mkdtemp(prefix="countersign-profile-"))
        sandbox, sandbox_url = start_sandbox(
            Path(settings.BASE_DIR), dict(os.environ), tmp / "sandbox", tmp
        )
        try:
            settings.SANDBOX_URL = sandbox_url
            add_orders(sandbox_url, total)
            run_ids = driver.setup(total, 20)["run_ids"]
            propose = (_via_api if options["via"] == "api" else _via_service)(run_ids)
            for i in range(options["warmup"]):
                propose(i)
            self.measure(propose, options["warmup"], total, options)
        finally:
            sandbox.stop()
            shutil.rmtree(tmp, ignore_errors=True)
            claim_redis(os.environ["CELERY_BROKER_URL"])

    def measure(
        self, propose: Callable[[int], None], first: int, total: int, options: dict[str, Any]
    ) -> None:
        statements = 0

        def counted(execute, sql, params, many, context):
            nonlocal statements
            statements += 1
            return execute(sql, params, many, context)

        middle = first + (total - first) // 2
        profiler = cProfile.Profile(time.process_time)
        backend = _backend_pid()
        with connection.execute_wrapper(counted):
            server_started = _cpu_seconds(backend)
            started = time.process_time()
            for i in range(first, middle):
                propose(i)
            bare = time.process_time() - started
            for i in range(middle, total):
                profiler.enable()
                propose(i)
                profiler.disable()
            server = _cpu_seconds(backend) - server_started
        calls = total - first
        self.stdout.write(
            f"proposals via {options['via']}: {calls} (after {first} not counted); "
            f"CPU ms per proposal, no profiler: {bare * 1000 / (middle - first):.2f}; "
            f"SQL statements per proposal: {statements / calls:.2f}; "
            f"PostgreSQL CPU ms per proposal (its backend, all {calls}): "
            f"{server * 1000 / calls:.2f}"
        )
        self.report(profiler, total - middle, options["top"])
        if options["dump"]:
            profiler.dump_stats(options["dump"])

    def report(self, profile: cProfile.Profile, calls: int, top: int) -> None:
        stats = pstats.Stats(profile)
        self.stdout.write(
            f"\n== under cProfile: {stats.total_tt * 1000 / calls:.2f} ms CPU per proposal =="
        )
        for sort in ("tottime", "cumulative"):
            out = io.StringIO()
            stats.stream = out
            stats.sort_stats(sort).print_stats(top)
            self.stdout.write(f"-- by {sort} (seconds over {calls} proposals)")
            self.stdout.write(out.getvalue().split("ncalls", 1)[-1])


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _cpu_seconds(pid: int) -> float:
    """The backend's CPU (user + system) from /proc: the server runs on this machine. The
    profiler does not slow the server, so all the proposals count (in clock ticks: 10 ms)."""
    from bench.cpu import _cpu_seconds as read

    seconds = read(pid)
    if seconds is None:
        raise CommandError(f"cannot read /proc/{pid}/stat (is PostgreSQL on this machine?)")
    return seconds


def _args(i: int) -> dict[str, Any]:
    from bench import driver

    order = f"order-{driver.FIRST_ORDER + i}"
    return {"order_id": order, "amount_cents": 1, "currency": "USD", "reason": f"bench {i}"}


def _via_service(run_ids: list[str]) -> Callable[[int], None]:
    from bench import driver
    from runs.models import Tenant
    from toolcalls.propose import tool_call_propose

    tenant = Tenant.objects.get(slug=driver.TENANT)
    tag = uuid.uuid4().hex[:8]

    def propose(i: int) -> None:
        tool_call_propose(
            tenant=tenant,
            run_id=run_ids[i % len(run_ids)],
            capability_id=driver.CAPABILITY,
            args=_args(i),
            intent=f"profile-{tag}-{i}",
            actor=driver.ACTOR,
        )

    return propose


def _via_api(run_ids: list[str]) -> Callable[[int], None]:
    from django.test import Client

    from bench import driver
    from runs.models import Tenant
    from runs.services import api_key_issue

    tenant = Tenant.objects.get(slug=driver.TENANT)
    tag = uuid.uuid4().hex[:8]
    _, token = api_key_issue(tenant=tenant, name=f"profile {tag}", scopes=["*"])
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_HOST="localhost")

    def propose(i: int) -> None:
        body = {"capability": driver.CAPABILITY, "args": _args(i), "intent": f"api-{tag}-{i}"}
        path = f"/api/v1/runs/{run_ids[i % len(run_ids)]}/tool-calls"
        response = client.post(path, body, content_type="application/json")
        if response.status_code != 201:
            raise CommandError(f"{path} answered {response.status_code}: {response.content!r}")

    return propose
