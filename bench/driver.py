"""The part of the benchmark that runs inside Django, against the benchmark database only.

`setup` creates the tenant and the runs; `drive` proposes the calls from several threads
through `toolcalls.propose.tool_call_propose`, waits until every call is completed and
confirmed, and measures from the event log. Everything it reads while waiting goes through
one counted psycopg connection, so its statements can be taken out of the server's totals.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection

from bench import pgstats
from bench.analyze import AutoAnalyze

TENANT = "acme"
# Call i refunds order FIRST_ORDER + i, which the benchmark adds to the sandbox for acme
# (`POST /orders`): an order of its own, so no look-up's answer grows with the calls made.
FIRST_ORDER = 100_000
CAPABILITY = "refund-order-v2"
ACTOR = "api_key:bench"
FAILED_EXECUTION = {"failed", "needs_human", "cancelled", "rejected", "expired", "invalidated"}
FAILED_VERIFICATION = {"confirmed_failure", "inconclusive"}
# The events of one call in lifecycle order; several commit together in one transaction.
PHASES = [
    ("propose tx", "created", "tool_call.authorized"),
    ("queue+claim (dispatch hop)", "tool_call.authorized", "tool_call.dispatching"),
    ("send+record", "tool_call.dispatching", "tool_call.accepted"),
    ("verify hop", "tool_call.accepted", "tool_call.confirmed_success"),
]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def setup(calls: int, calls_per_run: int) -> dict[str, Any]:
    from runs.models import Tenant
    from runs.services import run_start

    tenant, _ = Tenant.objects.get_or_create(slug=TENANT, defaults={"name": "Bench"})
    runs = math.ceil(calls / calls_per_run)
    run_ids = []
    for index in range(runs):
        run, _ = run_start(
            tenant=tenant,
            title=f"bench run {index}",
            actor=ACTOR,
            max_tool_calls=calls_per_run,
            max_attempts=calls_per_run * 10,
        )
        run_ids.append(run.pk)
    return {"tenant_id": tenant.pk, "run_ids": run_ids}


class Monitor:
    """A counted, autocommit connection: every statement is one server-side commit."""

    def __init__(self) -> None:
        db = settings.DATABASES["default"]
        url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
        self.conninfo = pgstats.conninfo(url)
        self.conn = psycopg.connect(self.conninfo, autocommit=True)
        self.statements = 0

    def all(self, query: str, params: Any = None) -> list[tuple]:
        self.statements += 1
        return self.conn.execute(query, params).fetchall()

    def close(self) -> None:
        self.conn.close()


def drive(
    *,
    calls: int,
    run_ids: list[str],
    threads: int,
    tag: str,
    timeout: float,
    rate: float = 0,
    poll_interval: float = 0.5,
) -> dict[str, Any]:
    from config import gc_freeze
    from runs.models import Tenant
    from toolcalls.propose import tool_call_propose

    monitor = Monitor()
    try:
        row = monitor.all("SELECT id, slug, name FROM runs_tenant WHERE slug = %s", [TENANT])[0]
        tenant = Tenant(id=row[0], slug=row[1], name=row[2])
        errors: list[str] = []
        statements = Counter()
        lock = threading.Lock()

        def propose_slice(offset: int) -> None:
            count = 0

            def counted(execute, sql, params, many, context):
                nonlocal count
                count += 1
                return execute(sql, params, many, context)

            try:
                with connection.execute_wrapper(counted):
                    for i in range(offset, calls, threads):
                        if time.monotonic() > deadline:
                            break  # out of time: report what was proposed
                        if rate:  # call i is due i / rate seconds after the start
                            time.sleep(max(0.0, paced_from + i / rate - time.monotonic()))
                        try:
                            tool_call_propose(
                                tenant=tenant,
                                run_id=run_ids[i % len(run_ids)],
                                capability_id=CAPABILITY,
                                args={
                                    "order_id": f"order-{FIRST_ORDER + i}",
                                    "amount_cents": 1,
                                    "currency": "USD",
                                    "reason": f"bench {i}",
                                },
                                intent=f"bench-{tag}-{i}",
                                actor=ACTOR,
                            )
                        except Exception as exc:  # report, do not stop the other proposals
                            with lock:
                                errors.append(f"call {i}: {type(exc).__name__}: {exc}")
            finally:
                connection.close()
                with lock:
                    statements["propose"] += count

        analyzer = AutoAnalyze(monitor.conninfo)
        analyzer.start()
        gc_freeze.freeze()  # the proposals stand in for the web process (config/wsgi.py)
        started, cpu_started = time.time(), time.process_time()
        deadline = time.monotonic() + timeout
        paced_from = time.monotonic()
        with ThreadPoolExecutor(threads, thread_name_prefix="propose") as pool:
            futures = [pool.submit(propose_slice, offset) for offset in range(threads)]
            for future in futures:
                future.result()
        proposals_done = time.time()

        status_query = (
            "SELECT execution_status, verification_status, count(*) FROM toolcalls_toolcall "
            "WHERE run_id = ANY(%s) GROUP BY 1, 2"
        )
        statuses: dict[str, int] = {}
        timed_out = False
        while True:
            rows = monitor.all(status_query, [run_ids])
            statuses = {f"{e}/{v}": n for e, v, n in rows}
            done = sum(n for e, v, n in rows if e == "completed" and v == "confirmed_success")
            failed = sum(n for e, v, n in rows if e in FAILED_EXECUTION or v in FAILED_VERIFICATION)
            proposed = sum(statuses.values())
            if done + failed >= proposed and proposed + len(errors) >= calls:
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(poll_interval)
        waited_done, cpu_used = time.time(), time.process_time() - cpu_started
        analyzer.stop()

        result: dict[str, Any] = {
            "calls": calls,
            "proposed": proposed,
            "propose_errors": len(errors),
            "propose_error_samples": errors[:5],
            "confirmed": done,
            "failed": failed,
            "timed_out": timed_out,
            "statuses": statuses,
            "started": started,
            "proposals_done": proposals_done,
            "waited_done": waited_done,
            "propose_statements": statements["propose"],
            "driver_cpu": cpu_used,
        }
        result.update(_timings(monitor, run_ids, started))
        result["monitor_statements"] = monitor.statements + analyzer.statements
        result["analyzed"] = dict(analyzer.analyzed) if analyzer.off else None
        return result
    finally:
        monitor.close()


def _timings(monitor: Monitor, run_ids: list[str], started: float) -> dict[str, Any]:
    rows = monitor.all(
        "SELECT tc.id, extract(epoch FROM tc.created_at), e.event_type,"
        " extract(epoch FROM e.recorded_at) FROM toolcalls_toolcall tc"
        " JOIN runs_event e ON e.tool_call_id = tc.id WHERE tc.run_id = ANY(%s)",
        [run_ids],
    )
    per_call: dict[str, dict[str, float]] = {}
    event_counts = Counter()
    for call_id, created, event_type, recorded in rows:
        marks = per_call.setdefault(call_id, {"created": float(created)})
        marks[event_type] = float(recorded)
        event_counts[event_type] += 1
    to_accepted = [
        m["tool_call.accepted"] - m["created"]
        for m in per_call.values()
        if "tool_call.accepted" in m
    ]
    confirmed = [
        m["tool_call.confirmed_success"]
        for m in per_call.values()
        if "tool_call.confirmed_success" in m
    ]
    phases = {}
    for label, start, end in PHASES:
        spans = [m[end] - m[start] for m in per_call.values() if start in m and end in m]
        phases[label] = {
            "mean": sum(spans) / len(spans) if spans else float("nan"),
            "p50": percentile(spans, 50),
            "p99": percentile(spans, 99),
        }
    outbox = monitor.all(
        "SELECT task, count(*), count(*) FILTER (WHERE published_count > 0)"
        " FROM runs_outboxmessage WHERE created_at >= to_timestamp(%s) GROUP BY 1",
        [started - 1],
    )
    attempts = monitor.all(
        "SELECT count(*) FROM toolcalls_attempt WHERE run_id = ANY(%s)", [run_ids]
    )[0][0]
    return {
        "ended": max(confirmed) if confirmed else None,
        "first_created": min((m["created"] for m in per_call.values()), default=None),
        "accepted_latency": {
            "n": len(to_accepted),
            "p50": percentile(to_accepted, 50),
            "p99": percentile(to_accepted, 99),
            "max": max(to_accepted, default=float("nan")),
        },
        "phases": phases,
        "events": dict(event_counts),
        "outbox": {task: {"messages": n, "republished": r} for task, n, r in outbox},
        "attempts": attempts,
    }


def write_json(path: str, data: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(data, indent=1, default=str))
