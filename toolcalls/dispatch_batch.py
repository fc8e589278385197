"""Batched dispatch (issue 12, point 2): many ready calls per task, the same invariants.

A batch is the single-call path of toolcalls/dispatch.py done for many calls at once, with
the work shared where it can be: one transaction claims them all (one statement locks the
calls, skipping those another worker holds; one reads what every claim must know; one
inserts the attempts; the events go in one INSERT), the requests are sent concurrently, the
answers observed concurrently, and one transaction records every outcome (each only if its
fencing token is still current) with the verifications observed. Each call still gets its own
fencing token, lease, attempt and events, through the single path's own functions
(`claim_locked`, `record_locked`, `judge`).

Runs are locked in one order (the calls are handled by run, then id), so two batches that
share runs wait for each other instead of deadlocking.
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import replace
from typing import TypeVar

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from runs import events, logcontext, transitions
from runs import sql as runs_sql
from runs.faults import crashpoint
from toolcalls import dispatch, sql, sql_batch, webhooks
from toolcalls.dispatch import (
    Claim,
    claim_locked,
    observable,
    observe_sent,
    record_locked,
    record_outcome,
    tool_call_dispatch,
)
from toolcalls.models import Attempt, ToolCall
from toolcalls.record import RecordWrites
from toolcalls.send import Outcome, send
from toolcalls.verify import judge, observe, wake_dependents
from toolcalls.writes import bind_log_ids

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")


def tool_calls_dispatch_batch(items: list[tuple[str, str | None]], *, worker: str = "") -> None:
    """Dispatch the calls named by (tool call id, id of the outbox message that asked, or
    None). A call that another transaction holds is skipped and its message left undone, so it
    comes again. Safe to run twice or concurrently for the same calls."""
    try:
        claims = claim_batch(items, worker=worker)
    except Exception:
        if len(items) == 1:
            raise
        # One call's claim raised and rolled the batch back (a bug, or a deadlock): one by
        # one, that call fails alone and the others go, instead of the batch failing forever.
        log.exception("claiming a batch of %d failed; dispatching its calls one by one", len(items))
        _dispatch_one_by_one(items, worker)
        return
    if not claims:
        return
    crashpoint("before_send")
    outcomes = send_batch(claims)
    crashpoint("after_send")
    # A send that raised (a bug, not an answer) is not recorded: its lease runs out and the
    # sweeper hands the call to reconciliation, as when a single-call worker dies there.
    pairs = zip(claims, outcomes, strict=True)
    sent = [(claim, outcome) for claim, outcome in pairs if outcome is not None]
    # Observed before the record, so that each answer and its verification are written in one
    # transaction; a call whose observation failed or came late is recorded all the same and
    # its verification's message runs later.
    judgments = observe_batch(sent)
    try:
        record_batch(sent, judgments)
    except Exception:
        if len(sent) == 1 and not judgments:
            raise
        # The answers are not lost with the batch's transaction: recorded without the
        # judgments, then one by one, and verified apart, as before the two were merged.
        log.exception("recording a batch of %d failed; recording apart", len(sent))
        accepted = _record_apart(sent)
        if accepted:
            verify_batch(accepted)


def _record_apart(sent: list[tuple[Claim, Outcome]]) -> list[tuple[ToolCall, str]]:
    if len(sent) > 1:
        try:
            return record_batch(sent)
        except Exception:
            log.exception("recording a batch of %d failed; recording one by one", len(sent))
    return _record_one_by_one(sent)


def _dispatch_one_by_one(items: list[tuple[str, str | None]], worker: str) -> None:
    for tool_call_id, outbox_id in items:
        try:
            tool_call_dispatch(tool_call_id=tool_call_id, outbox_id=outbox_id, worker=worker)
        except Exception:
            log.exception("dispatching %s failed; its message stays undone", tool_call_id)


def _record_one_by_one(sent: list[tuple[Claim, Outcome]]) -> list[tuple[ToolCall, str]]:
    accepted = []
    for claim, outcome in sent:
        try:
            verify_now = record_outcome(claim, outcome)
        except Exception:
            log.exception("recording %s failed; its lease will expire", claim.tool_call_id)
            continue
        if verify_now:
            accepted.append(verify_now)
    return accepted


# --- claim ----------------------------------------------------------------------------------


@transaction.atomic
def claim_batch(items: list[tuple[str, str | None]], *, worker: str = "") -> list[Claim]:
    """Take every call of `items` that is ready, in one transaction; nothing is sent here."""
    ids = list(dict.fromkeys(call_id for call_id, _ in items))
    # The calls and what each claim must know, in one statement.
    calls, readiness = sql_batch.lock_calls_ready(ids)
    handled = {call.id for call in calls} | _gone(ids, calls)
    _mark_done([outbox_id for call_id, outbox_id in items if outbox_id and call_id in handled])
    now = timezone.now()
    # The claimed calls are saved when the block ends: one UPDATE for those that changed the
    # same columns (all of them, for a batch of plain claims), rather than one per call. Not
    # when a call has dependencies: its claim reads them from the database, and one of them
    # may be in this batch, changed here (failed unsent) but not saved yet.
    waits = any(ready.has_dependencies for ready in readiness.values())
    batch = events.batch(_runs_of(calls))
    with batch, webhooks.hooks_read_once(), transitions.saved_together([] if waits else calls):
        # The attempts are inserted after the loop: count those this batch takes in a run, as
        # the single path's next claim would count them in the database.
        taken: Counter[str] = Counter()
        attempts: list[Attempt] = []
        claims = []
        for call in calls:
            bind_log_ids(call)
            ready = readiness[call.id]
            ready = replace(ready, attempts_in_run=ready.attempts_in_run + taken[call.run_id])
            claim = claim_locked(call, now, worker, attempts=attempts, ready=ready)
            if claim is not None:
                claims.append(claim)
                taken[call.run_id] += 1
        runs_sql.insert_rows(attempts)  # written out: the ORM's compiling was most of it
        if claims:
            crashpoint("inside_claim")  # uncommitted, holding the calls' row locks and runs'
    return claims


def _runs_of(calls: list[ToolCall]) -> dict[str, str]:
    return {call.id: call.run_id for call in calls}


def _gone(ids: list[str], locked: list[ToolCall]) -> set[str]:
    """The ids of calls that do not exist (their messages are done): a call not locked is
    either held by another transaction or not there, and only the first comes again."""
    missing = set(ids) - {call.id for call in locked}
    if not missing:
        return set()
    return missing - set(ToolCall.objects.filter(pk__in=missing).values_list("pk", flat=True))


def _mark_done(outbox_ids: list[str]) -> None:
    """Like runs.outbox.mark_done, for many messages in one statement."""
    if outbox_ids:
        sql_batch.mark_done(outbox_ids, timezone.now())


# --- send -----------------------------------------------------------------------------------


def send_batch(claims: list[Claim]) -> list[Outcome | None]:
    """Each claim's request, concurrently; None for a send that raised."""
    return concurrently(_send_one, claims)


def _send_one(claim: Claim) -> Outcome | None:
    # In this thread's copy of the task's context: its log lines name this call.
    logcontext.bind(tenant=claim.tenant_slug, run_id=claim.run_id, tool_call_id=claim.tool_call_id)
    try:
        return send(claim)
    except Exception:
        log.exception("sending %s raised; its lease will expire", claim.tool_call_id)
        return None


_pools: dict[int, ThreadPoolExecutor] = {}
_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    # One pool per process, like the HTTP client (toolcalls/connectors.py): a pool made before
    # a fork would have no threads in the child.
    pid = os.getpid()
    pool = _pools.get(pid)
    if pool is None:
        with _lock:
            pool = _pools.get(pid)
            if pool is None:
                pool = ThreadPoolExecutor(
                    max_workers=settings.DISPATCH_SEND_THREADS, thread_name_prefix="dispatch-send"
                )
                _pools[pid] = pool
    return pool


def concurrently(
    function: Callable[[T], R], items: list[T], *, timeout: float | None = None
) -> list[R | None]:
    """function(item) for each item, in the process's send pool; the results in order, None
    for those not done within `timeout` seconds (they run on, their results dropped). The
    functions must not use the database: the pool's threads have no transaction of ours."""
    if len(items) <= 1:
        return [function(item) for item in items]  # a batch of one waits for no thread
    # Each in a copy of this context: its log lines and spans name the task's ids.
    futures = [_pool().submit(contextvars.copy_context().run, function, i) for i in items]
    done, _ = wait(futures, timeout=timeout)
    return [future.result() if future in done else None for future in futures]


# --- record and verify ----------------------------------------------------------------------


def observe_batch(sent: list[tuple[Claim, Outcome]]) -> dict[str, str]:
    """`dispatch.observe_sent` of every answer, concurrently: the judgments by call id,
    without those that raised or were not back in OBSERVE_SECONDS (they run on; their
    verification's message verifies them later)."""
    asked = [(claim, outcome) for claim, outcome in sent if observable(claim, outcome)]
    judgments = concurrently(_observe_sent, asked, timeout=dispatch.OBSERVE_SECONDS)
    return {
        claim.tool_call_id: judgment
        for (claim, _), judgment in zip(asked, judgments, strict=True)
        if judgment is not None
    }


def _observe_sent(sent: tuple[Claim, Outcome]) -> str | None:
    claim, outcome = sent
    logcontext.bind(tenant=claim.tenant_slug, run_id=claim.run_id, tool_call_id=claim.tool_call_id)
    return observe_sent(claim, outcome)


@transaction.atomic
def record_batch(
    sent: list[tuple[Claim, Outcome]], judgments: dict[str, str] | None = None
) -> list[tuple[ToolCall, str]]:
    """Record every outcome in one transaction, each only if its claim is still current, and
    the verification of each accepted call observed already (`judgments`, by call id) in the
    same one. Returns the accepted calls left to verify, with their verification's message."""
    if not sent:
        return []
    by_id = {claim.tool_call_id: (claim, outcome) for claim, outcome in sent}
    judgments = judgments or {}
    accepted = []
    confirmed: list[str] = []
    calls = sql.lock_calls(list(by_id))
    now = timezone.now()
    writes = RecordWrites()
    # Every call saved once, when both its record and its verification are written: one
    # UPDATE for the calls that changed the same columns.
    batch = events.batch(_runs_of(calls))
    with batch, webhooks.hooks_read_once(), transitions.saved_together(calls):
        for call in calls:
            bind_log_ids(call)
            claim, outcome = by_id[call.id]
            verify_now = record_locked(call, claim, outcome, now, writes=writes)
            if verify_now:
                accepted.append(verify_now)
        judged = [(call, message) for call, message in accepted if call.id in judgments]
        writes.verified_already({message for _, message in judged})
        # The attempts' ends, receipts, revisions and verification messages of every call:
        # one statement of each kind.
        writes.flush()
        for call, _ in judged:
            bind_log_ids(call)
            judge(call.id, None, judgments[call.id], locked=call, confirmed=confirmed)
    wake_dependents(confirmed)  # read once the judgments are written, as each judge would
    return [(call, message_id) for call, message_id in accepted if call.id not in judgments]


def verify_batch(accepted: list[tuple[ToolCall, str]]) -> None:
    """Observe every accepted call concurrently, then write the judgments in one transaction.
    Each verification's outbox message is the safety net: if this fails, it runs later."""
    judgments = concurrently(_observe_one, [call for call, _ in accepted])
    observed = {
        call.pk: (outbox_id, judgment)
        for (call, outbox_id), judgment in zip(accepted, judgments, strict=True)
        if judgment is not None
    }
    if not observed:
        return
    try:
        with transaction.atomic():
            calls = sql.lock_calls(list(observed))
            _mark_done([outbox_id for outbox_id, _ in observed.values()])
            confirmed: list[str] = []
            batch = events.batch(_runs_of(calls))
            with batch, webhooks.hooks_read_once(), transitions.saved_together(calls):
                for call in calls:
                    bind_log_ids(call)
                    _, judgment = observed[call.pk]
                    judge(call.pk, None, judgment, locked=call, confirmed=confirmed)
            # Read when the judgments are written, just before commit, as each judge would.
            wake_dependents(confirmed)
    except Exception:
        log.exception("verifying a batch failed; its verification messages will run")


def _observe_one(call: ToolCall) -> str | None:
    bind_log_ids(call)
    try:
        return observe(call)
    except Exception:
        log.exception("observing %s raised; its verification message will run", call.pk)
        return None
