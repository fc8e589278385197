"""How long the approval page takes on the server, at the demo's data and beyond.

    python manage.py bench_console [--runs 70] [--requests 200]

Needs an empty database (the embedded default in a fresh COUNTERSIGN_VAR_DIR, or a new
PostgreSQL database in DATABASE_URL): migrates it, starts the sandbox in a temporary
directory, and writes what the demo's agent leaves after a while — `--runs` runs, each with a
read of the order, a refund over $200 that waits for or got a decision, and an email — through
the real services. Then it renders one pending approval's page `--requests` times in this
process (middleware, queries, template: what a web worker does for the request) and prints
wall and CPU milliseconds per request (median, p90), the queries per page, and the same for the
context fragment, which reads the payment gateway. Prints figures; asserts nothing.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals.models import Approval
from bench.procs import start_sandbox
from console.management.commands.demo import Command as Demo
from runs.models import Run, Tenant, User
from runs.services import run_start
from toolcalls import dispatch, gate
from toolcalls.models import ToolCall
from toolcalls.propose import tool_call_propose

ROOT = Path(settings.BASE_DIR)
# acme's orders that can take a $201 refund (order-001 captured only $120).
ORDERS = [f"order-{n:03d}" for n in range(2, 16)]


class Command(BaseCommand):
    help = "Server time of the approval page at the demo's data (prints figures)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--runs", type=int, default=70, help="runs to seed (demo: ~70)")
        parser.add_argument("--requests", type=int, default=200, help="page renders to time")
        parser.add_argument(
            "--profile", action="store_true", help="also print where the page's CPU time goes"
        )

    def handle(self, *args: object, **options: Any) -> None:
        call_command("migrate", verbosity=0)
        if Tenant.objects.filter(slug="acme").exists():
            raise CommandError("bench_console needs an empty database (it seeds tenant acme).")
        tenant, _ = Demo(stdout=self.stdout).seed()
        with tempfile.TemporaryDirectory() as scratch:
            child, url = start_sandbox(
                ROOT, dict(os.environ), Path(scratch) / "data", Path(scratch)
            )
            try:
                settings.SANDBOX_URL = url
                approval = self.seed(tenant, options["runs"])
                self.measure(approval, options["requests"], options["profile"])
            finally:
                child.stop()

    def seed(self, tenant: Tenant, runs: int) -> Approval:
        """Runs as the demo's agent leaves them: most refunds decided, some waiting."""
        alice = User.objects.get(username="alice")
        waiting = None
        for n in range(runs):
            run, _ = run_start(tenant=tenant, title=f"Refund run {n}", actor="bench")
            order = ORDERS[n % len(ORDERS)]
            read, _ = tool_call_propose(
                tenant=tenant,
                run_id=run.pk,
                capability_id="get-order-v1",
                args={"order_id": order},
                intent=f"read-{n}",
                actor="bench",
            )
            dispatch.tool_call_dispatch(tool_call_id=read.pk, worker="bench")
            refund, _ = tool_call_propose(
                tenant=tenant,
                run_id=run.pk,
                capability_id="refund-order-v2",
                args={"order_id": order, "amount_cents": 20100, "currency": "USD"},
                intent=f"refund-{n}",
                actor="bench",
            )
            approval = refund.approvals.get()
            if n < runs - 10:
                # Decided long ago: rejected, so the orders keep room for the waiting ones.
                gate.tool_call_reject(
                    tenant=tenant,
                    approval_id=approval.pk,
                    user=alice,
                    seen_version=approval.version,
                    seen_summary_hash=approval.summary_hash,
                    reason="not eligible",
                )
            else:
                waiting = approval
        if waiting is None:
            raise CommandError("--runs must be at least 1")
        return waiting

    def measure(self, approval: Approval, requests: int, profile: bool) -> None:
        client = Client(HTTP_HOST="127.0.0.1")
        client.force_login(User.objects.get(username="bob"))
        self.stdout.write(
            f"data: {Approval.objects.count()} approvals, "
            f"{Run.objects.count()} runs, {ToolCall.objects.count()} tool calls; "
            f"database {connection.vendor}"
        )
        for name, path in (
            ("approval page", f"/approvals/{approval.pk}/"),
            ("context fragment (reads the payment gateway)", f"/approvals/{approval.pk}/context/"),
        ):
            client.get(path)  # warm: templates, the session, connections
            walls, cpus = [], []
            for _ in range(requests):
                wall, cpu = time.perf_counter(), time.thread_time()
                response = client.get(path)
                cpus.append((time.thread_time() - cpu) * 1000)
                walls.append((time.perf_counter() - wall) * 1000)
                if response.status_code != 200:
                    raise CommandError(f"{path}: {response.status_code}")
            with CaptureQueriesContext(connection) as queries:
                client.get(path)
            self.stdout.write(
                f"{name}: wall {statistics.median(walls):.1f} ms median, "
                f"{statistics.quantiles(walls, n=10)[-1]:.1f} ms p90; "
                f"CPU {statistics.median(cpus):.1f} ms median; {len(queries)} queries"
            )
            if profile:
                profiler = cProfile.Profile(time.thread_time)
                for _ in range(20):
                    profiler.runcall(client.get, path)
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(30)
                self.stdout.write(text.getvalue())
