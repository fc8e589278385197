"""What a dispatched call costs the worker, single or batched, measured with a CPU clock.

    python manage.py profile_dispatch --database cs_hd_bench --redis-db 13 --calls 300 \
        --batch 0 1 10 50 [--profile]

In one process, against a database that bench_dispatch made (its mark is checked; run
bench_dispatch once first): starts a sandbox, then for each `--batch` value proposes `--calls`
refunds through `tool_call_propose` (each value on orders of its own, so no answer grows) and
dispatches them: 0 is the single-call path, the Celery task body of today
(`tool_call_dispatch` per call: claim, send, record, verify); N is
`tool_calls_dispatch_batch` on N calls at a time (claim in one transaction, send
concurrently, record in one, verify together), as the outbox drainer calls it. For each it
prints, per call: this process's CPU (`time.process_time`: every thread, the send pool's
included), the SQL statements it sent, the CPU of its PostgreSQL backend and of the sandbox
(both from /proc), and the wall time. With `--profile` each dispatch also runs under cProfile
(its CPU then includes the profiler's) and the functions that cost the most are printed, the
proposal's too. The dispatch messages the proposals publish land in the given Redis database,
which is emptied before and after.
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
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from bench import pgstats
from bench.cpu import _cpu_seconds
from bench.management.commands.bench_dispatch import MARK, OWNER, claim_redis
from bench.ownership import reexec_in
from bench.procs import start_sandbox
from bench.sandbox_http import add_orders


class Command(BaseCommand):
    help = "CPU and SQL per dispatched call, single-call path and batches."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--database", required=True, help="a database bench_dispatch made")
        parser.add_argument("--redis-db", type=int, required=True)
        parser.add_argument("--calls", type=int, default=300, help="per --batch value")
        parser.add_argument(
            "--batch",
            type=int,
            nargs="+",
            default=[0],
            help="0: the single-call path; N: tool_calls_dispatch_batch, N calls at a time",
        )
        parser.add_argument("--profile", action="store_true", help="print cProfile's figures")
        parser.add_argument("--top", type=int, default=30, help="functions listed per profile")
        parser.add_argument("--dump", help="write the last dispatch profile to this file")

    def handle(self, *args: Any, **options: Any) -> None:
        url = os.environ.get("DATABASE_URL", "")
        if not url.startswith("postgres"):
            raise CommandError("set DATABASE_URL=postgres://… (the server of --database)")
        if min(options["batch"]) < 0 or options["calls"] < 1:
            raise CommandError("--calls must be at least 1 and --batch values at least 0.")
        name = options["database"]
        if pgstats.database_comment(url, name) != MARK:
            raise CommandError(f"{name} is not a database bench_dispatch made: refused.")
        reexec_in(OWNER, name, options["redis_db"])
        self.measure_all(options)

    def measure_all(self, options: dict[str, Any]) -> None:
        calls, modes = options["calls"], options["batch"]
        tmp = Path(tempfile.mkdtemp(prefix="countersign-profile-"))
        sandbox, sandbox_url = start_sandbox(
            Path(settings.BASE_DIR), dict(os.environ), tmp / "sandbox", tmp
        )
        try:
            settings.SANDBOX_URL = sandbox_url
            # Orders of their own for the warm-up and for each mode.
            add_orders(sandbox_url, calls * len(modes) + 20)
            self.stdout.write(f"{calls} calls per mode; load average {_load()}")
            # Warm up (imports, caches, connections) with both paths; not measured.
            self.measure(sandbox, 10, 0, calls * len(modes), {**options, "profile": False})
            self.measure(sandbox, 10, 5, calls * len(modes) + 10, {**options, "profile": False})
            results = [
                self.measure(sandbox, calls, mode, calls * index, options)
                for index, mode in enumerate(modes)
            ]
            self.stdout.write(f"\nload average {_load()}")
            self.stdout.write(
                "mode | confirmed | worker CPU ms/call | SQL statements/call |"
                " PostgreSQL backend CPU ms/call | sandbox CPU ms/call | wall ms/call"
            )
            for row in results:
                self.stdout.write(" | ".join(row))
        finally:
            sandbox.stop()
            shutil.rmtree(tmp, ignore_errors=True)
            claim_redis(os.environ["CELERY_BROKER_URL"])

    def propose(self, calls: int, first_order: int, profile: cProfile.Profile | None) -> list:
        from bench import driver
        from runs.models import Tenant
        from toolcalls.propose import tool_call_propose

        run_ids = driver.setup(calls, 20)["run_ids"]
        tenant = Tenant.objects.get(slug=driver.TENANT)
        tag = uuid.uuid4().hex[:8]
        ids = []
        for i in range(calls):
            order = f"order-{driver.FIRST_ORDER + first_order + i}"
            with ExitStack() as stack:
                if profile:
                    stack.callback(profile.disable)
                    profile.enable()
                call, _ = tool_call_propose(
                    tenant=tenant,
                    run_id=run_ids[i % len(run_ids)],
                    capability_id=driver.CAPABILITY,
                    args={"order_id": order, "amount_cents": 1, "currency": "USD"},
                    intent=f"profile-{tag}-{i}",
                    actor=driver.ACTOR,
                )
            ids.append(call.pk)
        return ids

    def measure(
        self, sandbox: Any, calls: int, mode: int, first_order: int, options: dict[str, Any]
    ) -> list[str]:
        from django.db import connection

        from runs.models import OutboxMessage
        from toolcalls.dispatch import tool_call_dispatch
        from toolcalls.dispatch_batch import tool_calls_dispatch_batch
        from toolcalls.models import ToolCall

        proposer = cProfile.Profile(time.process_time) if options["profile"] else None
        ids = self.propose(calls, first_order, proposer)
        messages = dict(
            OutboxMessage.objects.filter(
                task="toolcalls.dispatch", done_at=None, args__0__in=ids
            ).values_list("args__0", "pk")
        )
        items = [(call_id, messages.get(call_id)) for call_id in ids]
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backend = cursor.fetchone()[0]
        statements = [0]

        def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            statements[0] += 1
            return execute(sql, params, many, context)

        worker = cProfile.Profile(time.process_time) if options["profile"] else None
        pg0, sandbox0 = _cpu_seconds(backend), _cpu_seconds(sandbox.pid)
        wall0, cpu0 = time.perf_counter(), time.process_time()
        with connection.execute_wrapper(count):
            if worker:
                worker.enable()
            if mode == 0:
                for call_id, outbox_id in items:
                    tool_call_dispatch(tool_call_id=call_id, outbox_id=outbox_id)
            else:
                for start in range(0, len(items), mode):
                    tool_calls_dispatch_batch(items[start : start + mode])
            if worker:
                worker.disable()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        pg, sandbox_cpu = _cpu_seconds(backend) - pg0, _cpu_seconds(sandbox.pid) - sandbox0
        done = ToolCall.objects.filter(pk__in=ids, verification_status="confirmed_success")
        title = "single path (tool_call_dispatch)" if mode == 0 else f"batches of {mode}"
        if worker and proposer:
            self.report("proposal (tool_call_propose)", proposer, calls, options["top"])
            self.report(f"worker, {title}", worker, calls, options["top"])
            if options["dump"]:
                worker.dump_stats(options["dump"])

        def per_call(value: float, scale: float = 1000) -> str:
            return f"{value * scale / calls:.2f}"

        return [
            title,
            f"{done.count()}/{calls}",
            per_call(cpu) + (" (profiled)" if worker else ""),
            per_call(statements[0], 1),
            per_call(pg),
            per_call(sandbox_cpu),
            per_call(wall),
        ]

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


def _load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())
