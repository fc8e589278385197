"""Where a call's CPU goes: the proposal and the worker's task body, under cProfile.

    python manage.py profile_dispatch --database countersign_bench --redis-db 2 --calls 300

In one process, against a database that bench_dispatch made (its mark is checked; run
bench_dispatch once first): starts a sandbox, proposes `--calls` refunds through
`tool_call_propose` under one profiler, then runs each call's dispatch task body
(`tool_call_dispatch`: claim, send, record, verify) in turn under another, both with a CPU
clock (`time.process_time`), and prints the functions that cost the most, per call. Celery's
own consume and publish are not in the worker's profile (bench_dispatch measures the whole
worker process); the dispatch messages the proposals publish land in the given Redis
database, which is emptied before and after.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from bench import pgstats
from bench.management.commands.bench_dispatch import (
    MARK,
    add_orders,
    claim_redis,
)
from bench.ownership import redis_db as _redis_db
from bench.procs import start_sandbox


class Command(BaseCommand):
    help = "Profile the proposal and the dispatch task body with a CPU clock."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--database", required=True, help="a database bench_dispatch made")
        parser.add_argument("--redis-db", type=int, required=True)
        parser.add_argument("--calls", type=int, default=300)
        parser.add_argument("--top", type=int, default=30, help="functions listed per profile")
        parser.add_argument("--dump", help="write the worker's raw profile to this file")

    def handle(self, *args: Any, **options: Any) -> None:
        url = os.environ.get("DATABASE_URL", "")
        if not url.startswith("postgres"):
            raise CommandError("set DATABASE_URL=postgres://… (the server of --database)")
        name = options["database"]
        if pgstats.database_comment(url, name) != MARK:
            raise CommandError(f"{name} is not a database bench_dispatch made: refused.")
        if settings.DATABASES["default"]["NAME"] != name:
            # Start again in a process whose settings name the benchmark's database and Redis.
            broker = _redis_db(os.environ.get("CELERY_BROKER_URL", ""), options["redis_db"])
            claim_redis(broker)
            env = {**os.environ, "DATABASE_URL": pgstats.with_database(url, name)}
            env.update(CELERY_BROKER_URL=broker, DJANGO_SETTINGS_MODULE="config.settings.base")
            env.update(DJANGO_DEBUG="0", LOG_LEVEL="WARNING")
            sys.stdout.flush()
            os.execve(sys.executable, [sys.executable, *sys.argv], env)
        self.profile(options)

    def profile(self, options: dict[str, Any]) -> None:
        from bench import driver
        from runs.models import OutboxMessage, Tenant
        from toolcalls.dispatch import tool_call_dispatch
        from toolcalls.models import ToolCall
        from toolcalls.propose import tool_call_propose

        calls = options["calls"]
        tmp = Path(tempfile.mkdtemp(prefix="countersign-profile-"))
        sandbox, sandbox_url = start_sandbox(
            Path(settings.BASE_DIR), dict(os.environ), tmp / "sandbox", tmp
        )
        try:
            settings.SANDBOX_URL = sandbox_url
            add_orders(sandbox_url, calls)
            run_ids = driver.setup(calls, 20)["run_ids"]
            tenant = Tenant.objects.get(slug=driver.TENANT)
            tag = uuid.uuid4().hex[:8]
            proposer = cProfile.Profile(time.process_time)
            ids = []
            for i in range(calls):
                args = {
                    "order_id": f"order-{driver.FIRST_ORDER + i}",
                    "amount_cents": 1,
                    "currency": "USD",
                }
                proposer.enable()
                call, _ = tool_call_propose(
                    tenant=tenant,
                    run_id=run_ids[i % len(run_ids)],
                    capability_id=driver.CAPABILITY,
                    args=args,
                    intent=f"profile-{tag}-{i}",
                    actor=driver.ACTOR,
                )
                proposer.disable()
                ids.append(call.pk)
            messages = dict(
                OutboxMessage.objects.filter(task="toolcalls.dispatch", done_at=None).values_list(
                    "args__0", "pk"
                )
            )
            worker = cProfile.Profile(time.process_time)
            for call_id in ids:
                worker.enable()
                tool_call_dispatch(tool_call_id=call_id, outbox_id=messages.get(call_id))
                worker.disable()
            done = ToolCall.objects.filter(pk__in=ids, verification_status="confirmed_success")
            self.stdout.write(f"{done.count()}/{calls} calls confirmed_success")
            self.report("proposal (tool_call_propose)", proposer, calls, options["top"])
            self.report("worker (tool_call_dispatch)", worker, calls, options["top"])
            if options["dump"]:
                worker.dump_stats(options["dump"])
        finally:
            sandbox.stop()
            shutil.rmtree(tmp, ignore_errors=True)
            claim_redis(os.environ["CELERY_BROKER_URL"])

    def report(self, title: str, profile: cProfile.Profile, calls: int, top: int) -> None:
        stats = pstats.Stats(profile)
        total = stats.total_tt
        self.stdout.write(f"\n== {title}: {total * 1000 / calls:.2f} ms CPU per call ==")
        for sort in ("tottime", "cumulative"):
            out = io.StringIO()
            stats.stream = out
            stats.sort_stats(sort).print_stats(top)
            self.stdout.write(f"-- by {sort} (seconds over {calls} calls)")
            self.stdout.write(out.getvalue().split("ncalls", 1)[-1])
