"""The part of `bench_approve` that runs inside Django, against the benchmark database only.

`setup` creates the tenant, an approver with a password and the runs; `load` proposes
auto-authorized refunds from several threads until told to stop (the bulk work that keeps the
workers busy); `clicks` proposes refunds over the approval threshold one at a time, logs the
approver in through the login page and posts the console's approve endpoint for each, and
measures from the POST's start to the call's `tool_call.dispatching` event.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import secrets
import threading
import time
from math import inf
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import redis
from django.conf import settings
from django.contrib.messages.storage.cookie import CookieStorage
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.test import Client

from bench.driver import ACTOR, CAPABILITY, FIRST_ORDER, TENANT, Monitor, percentile

# The clicked refunds: orders of their own, captured with room for a refund over $200.
FIRST_CLICK_ORDER = 900_000
CLICK_AMOUNT_CENTS = 20_100
CLICK_CAPTURED_CENTS = 50_000
APPROVER = "bench-approver"
LOAD_CALLS_PER_RUN = 200


def setup(clicks: int, load_calls: int) -> dict[str, Any]:
    from runs.models import Tenant, User
    from runs.services import run_start
    from toolcalls.models import ToolCall

    tenant, _ = Tenant.objects.get_or_create(slug=TENANT, defaults={"name": "Bench"})
    password = secrets.token_hex(8)
    user, _ = User.objects.get_or_create(
        username=APPROVER, defaults={"tenant": tenant, "role": "approver"}
    )
    user.set_password(password)
    user.save()

    def runs(count: int, per_run: int, label: str) -> list[str]:
        return [
            run_start(
                tenant=tenant,
                title=f"bench_approve {label} {i}",
                actor=ACTOR,
                max_tool_calls=per_run,
                max_attempts=per_run * 10,
            )[0].pk
            for i in range(count)
        ]

    return {
        # Orders of this run start past every call made before, in a database kept from an
        # earlier run: the business check counts our earlier refunds of an order.
        "offset": ToolCall.objects.count(),
        "password": password,
        # One run per click: a run waiting on its approval never holds up the next click.
        "click_runs": runs(clicks, 1, "click"),
        "load_runs": runs(max(1, -(-load_calls // LOAD_CALLS_PER_RUN)), LOAD_CALLS_PER_RUN, "load"),
    }


def _tenant():
    from runs.models import Tenant

    return Tenant.objects.get(slug=TENANT)


def load(
    *,
    run_ids: list[str],
    calls: int,
    threads: int,
    stop_file: str,
    offset: int,
    backlog: int,
    backlog_file: str,
    nice: int = 0,
) -> dict[str, Any]:
    """Propose auto-authorized refunds until `stop_file` exists or `calls` were proposed.
    `backlog_file` is written once the first `backlog` were proposed: the benchmark starts the
    workers then, so they begin behind a queue of bulk work (on two cores, proposing alone
    cannot outpace them)."""
    from config import priority
    from toolcalls.propose import tool_call_propose

    # The load stands for the agents' requests, which the Procfile's `api` line serves at
    # WEB_NICE (bench_approve --load-nice); the clicking process is the console's `web` line.
    priority.lower(nice)
    tenant = _tenant()
    stop = Path(stop_file)
    proposed = [0] * threads
    errors: list[str] = []
    backlog_done = threading.Barrier(threads, action=lambda: Path(backlog_file).touch())

    def propose(i: int) -> None:
        try:
            tool_call_propose(
                tenant=tenant,
                run_id=run_ids[i // LOAD_CALLS_PER_RUN],
                capability_id=CAPABILITY,
                args={
                    "order_id": f"order-{FIRST_ORDER + offset + i}",
                    "amount_cents": 1,
                    "currency": "USD",
                    "reason": f"load {i}",
                },
                intent=f"load-{i}",
                actor=ACTOR,
            )
        except Exception as exc:  # report, do not stop the load
            errors.append(f"load {i}: {type(exc).__name__}: {exc}")

    def propose_slice(first: int) -> None:
        try:
            waited = False
            for i in range(first, calls, threads):
                if i >= backlog and not waited:
                    waited = True
                    backlog_done.wait(timeout=900)
                if stop.exists():
                    return
                propose(i)
                proposed[first] += 1
        finally:
            connection.close()

    workers = [threading.Thread(target=propose_slice, args=(o,)) for o in range(threads)]
    started = time.time()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return {
        "proposed": sum(proposed),
        "errors": errors[:5],
        "error_count": len(errors),
        "seconds": time.time() - started,
    }


# long: one click after another, each step of the measure in order; then the figures
def clicks(
    *,
    run_ids: list[str],
    password: str,
    gap: float,
    timeout: float,
    broker: str,
    offset: int,
    profile: bool = False,
    warmup: int = 0,
) -> dict[str, Any]:
    from approvals.models import Approval
    from config import gc_freeze
    from toolcalls import gate
    from toolcalls.propose import tool_call_propose

    tenant = _tenant()
    client = Client(HTTP_HOST="127.0.0.1")
    login = client.post("/login/", {"username": APPROVER, "password": password})
    if login.status_code != 302:
        raise RuntimeError(f"the approver's login failed: {login.status_code}")
    queue = redis.Redis.from_url(broker)
    # --profile: where the POST's CPU goes (a CPU timer: waiting on the database is not in it).
    profiler = cProfile.Profile(time.thread_time) if profile else _Direct()
    monitor = Monitor()
    samples: list[dict[str, Any]] = []
    # This process only: the decision's business check, timed (the slow clicks' report).
    gate.business_check = check = _Timed(gate.business_check)
    commit = CommitTimer(connections[DEFAULT_DB_ALIAS])
    try:
        for i, run_id in enumerate(run_ids):
            if i == warmup:  # the web process freezes what it loaded (config/wsgi.py)
                gc_freeze.freeze()
            call, _ = tool_call_propose(
                tenant=tenant,
                run_id=run_id,
                capability_id=CAPABILITY,
                args={
                    "order_id": f"order-{FIRST_CLICK_ORDER + offset + i}",
                    "amount_cents": CLICK_AMOUNT_CENTS,
                    "currency": "USD",
                    "reason": f"click {i}",
                },
                intent=f"click-{i}",
                actor=ACTOR,
            )
            approval = Approval.objects.get(tool_call_id=call.pk)
            backlog = {q: queue.llen(q) for q in ("celery", "interactive")}
            # The bulk work waiting in the database (batched dispatch claims authorized calls
            # there; the queue holds only wake-ups): 0 means the workers had run dry.
            backlog["authorized"] = monitor.all(
                "SELECT count(*) FROM toolcalls_toolcall WHERE execution_status = 'authorized'"
            )[0][0]
            # As the approval page's form posts it (no enctype: urlencoded), encoded before the
            # POST as a browser does; the test client's default, multipart, put Django's
            # multipart parser in the POST (0.111 of 1.861 s in --profile, 31 POSTs).
            form = urlencode({"version": approval.version, "summary_hash": approval.summary_hash})
            backend = connection.connection.info.backend_pid
            queued, backend_queued = _schedstat("thread-self"), _schedstat(backend)
            backend_ran, check.ms, commit.ms = _schedstat(backend, 0), 0.0, 0.0
            started, cpu_started, waits = time.time(), time.thread_time(), _waits()
            queries = QueryCount()
            with connection.execute_wrapper(queries):
                response = profiler.runcall(
                    client.post,
                    f"/approvals/{approval.pk}/approve/",
                    form,
                    content_type="application/x-www-form-urlencoded",
                )
            posted, post_cpu = time.time(), time.thread_time() - cpu_started
            waits = _waits() - waits
            queued = _schedstat("thread-self") - queued
            backend_queued = _schedstat(backend) - backend_queued
            backend_ran = _schedstat(backend, 0) - backend_ran
            if response.status_code != 302:
                raise RuntimeError(
                    f"approve {approval.pk}: {response.status_code} {response.content[-2000:]}"
                )
            dispatching = _wait_dispatching(monitor, call.pk, started + timeout)
            # The decision's commit: the call's `authorized` event, in the POST's transaction.
            authorized = monitor.all(
                "SELECT extract(epoch FROM occurred_at) FROM runs_event WHERE tool_call_id = %s"
                " AND event_type = 'tool_call.authorized'",
                [call.pk],
            )[0][0]
            # The worker's task start: its claim's first statement marks the message done.
            received = monitor.all(
                "SELECT extract(epoch FROM done_at) FROM runs_outboxmessage"
                " WHERE task = 'toolcalls.dispatch_approved' AND args = %s::jsonb",
                [f'["{call.pk}"]'],
            )
            received = float(received[0][0]) if received and received[0][0] else None
            samples.append(
                {
                    "call": call.pk,
                    "started": started,
                    "post_ms": (posted - started) * 1000,
                    "post_cpu_ms": post_cpu * 1000,
                    "post_queries": queries.count,
                    "post_round_trips": queries.round_trips,
                    "post_waits": waits,
                    "post_runqueue_ms": queued,
                    "post_backend_runqueue_ms": backend_queued,
                    "post_backend_ran_ms": backend_ran,
                    "post_check_ms": check.ms,
                    "post_commit_ms": commit.ms,
                    "dispatching_ms": (dispatching - started) * 1000 if dispatching else None,
                    "hop_ms": (dispatching - float(authorized)) * 1000 if dispatching else None,
                    "backlog": backlog,
                    "receive_ms": (received - float(authorized)) * 1000 if received else None,
                    "claim_ms": (dispatching - received) * 1000
                    if dispatching and received
                    else None,
                }
            )
            # A browser follows the redirect, and the approval page shows the flash and drops
            # it: without that, every POST decoded and signed again all the flashes before it
            # (30 a POST by the last of 60 clicks: 1,890 messages serialized in --profile).
            client.cookies.pop(CookieStorage.cookie_name, None)
            time.sleep(gap)
        del samples[:warmup]  # the warm-up clicks: made the same way, not counted
        first, last = samples[0]["started"], time.time()
        background = monitor.all(
            "SELECT count(*) FROM runs_event WHERE event_type = 'tool_call.dispatching'"
            " AND occurred_at BETWEEN to_timestamp(%s) AND to_timestamp(%s)"
            " AND NOT (tool_call_id = ANY(%s))",
            [first, last, [s["call"] for s in samples]],
        )[0][0]
    finally:
        commit.remove()
        monitor.close()
    reached = [s["dispatching_ms"] for s in samples if s["dispatching_ms"] is not None]
    # A click whose call did not reach dispatching within the timeout counts as infinitely slow:
    # left out, it would make the percentiles look better the worse the queueing is.
    waits = [inf if s["dispatching_ms"] is None else s["dispatching_ms"] for s in samples]
    posts = [s["post_ms"] for s in samples]
    hops = [inf if s["hop_ms"] is None else s["hop_ms"] for s in samples]
    backlogs = [s["backlog"]["celery"] for s in samples]
    waiting = [s["backlog"]["authorized"] for s in samples]
    return {
        "clicks": len(samples),
        "reached": len(reached),
        "dispatching": {f"p{q}": percentile(waits, q) for q in (50, 95, 99)} | {"max": max(waits)},
        "post": {f"p{q}": percentile(posts, q) for q in (50, 95, 99)},
        "post_cpu": {f"p{q}": percentile([s["post_cpu_ms"] for s in samples], q) for q in (50, 99)},
        "post_commit": {
            f"p{q}": percentile([s["post_commit_ms"] for s in samples], q) for q in (50, 99)
        },
        "post_waits": {
            f"p{q}": percentile([s["post_waits"] for s in samples], q) for q in (50, 99)
        },
        "post_queries": samples[-1]["post_queries"],
        "post_round_trips": samples[-1]["post_round_trips"],
        "hop": {f"p{q}": percentile(hops, q) for q in (50, 95, 99)},
        "backlog": {"p50": percentile(backlogs, 50), "max": max(backlogs)},
        "authorized": {"min": min(waiting), "p50": percentile(waiting, 50)},
        "receive": _percentiles([s["receive_ms"] for s in samples]),
        "claim": _percentiles([s["claim_ms"] for s in samples]),
        "background_per_s": background / (last - first),
        "window_s": last - first,
        "database": settings.DATABASES["default"]["NAME"],
        # The tail's own story: a p99 is one or two clicks, and which part of them was slow
        # (the POST, the hand-off to the worker, the claim) says where to look.
        "slowest": sorted(samples, key=lambda s: -(s["dispatching_ms"] or inf))[:5],
        "profile": _top(profiler) if profile else "",
    }


def _percentiles(values: list[float | None]) -> dict[str, float]:
    """p50/p95/p99, a missing value (never received, or never claimed) counted as inf."""
    values = [inf if value is None else value for value in values]
    return {f"p{q}": percentile(values, q) for q in (50, 95, 99)}


def _waits() -> int:
    """The calling thread's voluntary context switches so far: each time it slept, for the
    database, the sandbox or Redis to answer (or for a lock). On a busy host each such wait
    may also wait for a core when it ends, so their number is what a loaded click pays for."""
    with open("/proc/thread-self/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    return 0


def _schedstat(task: int | str, field: int = 1) -> float:
    """Milliseconds the task (a thread, or the PostgreSQL backend's process when the database
    runs on this host) has spent runnable but waiting for a core so far (`field` 0: running):
    /proc/<task>/schedstat. 0 where it cannot be read."""
    try:
        with open(f"/proc/{task}/schedstat") as schedstat:
            return int(schedstat.read().split()[field]) / 1e6
    except (OSError, IndexError, ValueError):
        return 0.0


class _Timed:
    """Wraps the business check the decision runs (toolcalls/gate.py) and adds up its time:
    mostly the external system's (the sandbox's) answer, which shares the cores with the bulk
    work's requests to it."""

    def __init__(self, function: Any) -> None:
        self.function, self.ms, self.count = function, 0.0, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.function(*args, **kwargs)
        finally:
            self.ms += (time.perf_counter() - started) * 1000
            self.count += 1


class CommitTimer(_Timed):
    """Times the COMMITs a connection sends (Django's `_commit`, which the outermost atomic
    block's exit calls). With `synchronous_commit` on, each waits for the WAL's flush to disk:
    a disk whose flushes stall now and then (pgbench's one-row commits here: up to 150 ms, and
    16 over 20 ms in 30 s; docs/performance.md) shows in this figure, not in the CPU or the
    waits for a core."""

    def __init__(self, wrapper: Any) -> None:
        super().__init__(wrapper._commit)
        self._wrapper = wrapper
        wrapper._commit = self  # an instance attribute: the wrapper's own commit() calls it

    def remove(self) -> None:
        del self._wrapper._commit


class QueryCount:
    """Counts the statements a block runs. Not CaptureQueriesContext: its debug cursor renders
    every statement's SQL with its parameters (`last_executed_query`), which was a sixth of
    the measured POST's CPU (--profile) and is no part of a real request. Unlike it, this
    does not count the transaction's BEGIN and COMMIT (not statements run by a cursor).
    `round_trips`: the statements sent alone, plus one for each run of statements sent
    together in a pipeline (runs/pipeline.py)."""

    def __init__(self) -> None:
        self.count = 0
        self.round_trips = 0
        self._piped = False

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        from runs.pipeline import sending_together

        self.count += 1
        piped = sending_together(context["connection"].alias)
        if not (piped and self._piped):
            self.round_trips += 1
        self._piped = piped
        return execute(sql, params, many, context)


class _Direct:
    def runcall(self, function, *args, **kwargs):
        return function(*args, **kwargs)


def _top(profiler: cProfile.Profile) -> str:
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(35)
    return text.getvalue()


def _wait_dispatching(monitor: Monitor, call_id: str, deadline: float) -> float | None:
    """The `occurred_at` of the call's `tool_call.dispatching` event, as epoch seconds."""
    while time.time() < deadline:
        rows = monitor.all(
            "SELECT extract(epoch FROM occurred_at) FROM runs_event"
            " WHERE tool_call_id = %s AND event_type = 'tool_call.dispatching'"
            " ORDER BY occurred_at LIMIT 1",
            [call_id],
        )
        if rows:
            return float(rows[0][0])
        time.sleep(0.002)
    return None
