"""What `manage.py soak` measures once its faults have stopped, and the table it prints.

Everything is read from the soak's own database and the sandbox's ledger (the external
systems' record of what they did), after the system went quiet."""

from __future__ import annotations

import io
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import close_old_connections, connection
from django.db.models import Q

# Still moving by itself: not sent yet, sent and not answered, answered and not verified, or
# unknown while the reconciler looks it up. A call in needs_human is settled: a person owns it.
MOVING = (
    "proposed",
    "awaiting_approval",
    "authorized",
    "dispatching",
    "accepted",
    "compensating",
    "result_unknown",
)


def moving_count() -> int:
    close_old_connections()  # the soak cuts its connections too
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM toolcalls_toolcall"
            " WHERE execution_status = ANY(%s) OR verification_status = 'pending'",
            [list(MOVING)],
        )
        return cursor.fetchone()[0]


def proposed_count() -> int:
    close_old_connections()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM toolcalls_toolcall")
        return cursor.fetchone()[0]


def _one(sql: str, params: list[Any] | None = None) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return int(cursor.fetchone()[0])


def operations() -> dict[str, Any]:
    from toolcalls.models import ToolCall

    close_old_connections()
    rows = list(ToolCall.objects.values_list("execution_status", "verification_status"))
    final, unknown = set(ToolCall.FINAL_EXECUTION), set(ToolCall.UNKNOWN)
    terminal = sum(1 for e, v in rows if e in final and v != "pending")
    # On the unknowns desk, each with a person to own it (result_unknown only while the
    # reconciler is still looking it up).
    desk = sum(1 for e, _ in rows if e in unknown)
    confirmed_alone = _one(
        "SELECT count(*) FROM toolcalls_toolcall tc WHERE verification_status = 'confirmed_success'"
        " AND NOT EXISTS (SELECT 1 FROM runs_event e WHERE e.tool_call_id = tc.id"
        " AND e.event_type = 'tool_call.needs_human')"
    )
    return {
        "proposed": len(rows),
        "terminal": terminal,
        "desk": desk,
        "lost": len(rows) - terminal - desk,
        "confirmed_alone": confirmed_alone,
        "statuses": Counter(f"{e}/{v}" for e, v in rows),
    }


def lost_calls(limit: int = 5, events_each: int = 8) -> list[str]:
    """What a person needs to say why a call was lost, printed under the table: the first
    `limit` lost calls (not terminal, with no person), each with its dependencies, the outbox
    messages that name it and its last events. A CI log is often all there is of a failed
    soak: its database is dropped with the run."""
    from runs.models import Event, OutboxMessage
    from toolcalls.models import ToolCall

    close_old_connections()
    moving = ToolCall.objects.exclude(execution_status__in=ToolCall.UNKNOWN).filter(
        Q(execution_status__in=MOVING) | Q(verification_status="pending")
    )
    lines = []
    for call in moving.order_by("created_at")[:limit]:
        lines.append(
            f"  {call.pk} {call.capability_id} {call.execution_status}/"
            f"{call.verification_status} run {call.run_id} token {call.fencing_token}"
            f" next_attempt_at {_when(call.next_attempt_at)} lease {_when(call.lease_expires_at)}"
        )
        for dependency in call.depends_on.all():
            lines.append(
                f"    depends on {dependency.pk} {dependency.execution_status}/"
                f"{dependency.verification_status}"
            )
        messages = OutboxMessage.objects.filter(args__0=call.pk).order_by("created_at")
        for message in messages:
            lines.append(
                f"    outbox {message.pk} {message.task} created {_when(message.created_at)}"
                f" available {_when(message.available_at)} done {_when(message.done_at)}"
                f" published {message.published_count}"
            )
        last = Event.objects.filter(tool_call_id=call.pk).order_by("-seq")[:events_each]
        for event in reversed(list(last)):
            lines.append(
                f"    event {event.seq} {_when(event.occurred_at)} {event.event_type}"
                f" by {event.actor} ({event.producer})"
            )
    return lines


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.strftime("%H:%M:%S.%f")[:-3]


def effects(sandbox_url: str) -> dict[str, int]:
    """Each write a call sends carries its external request id, the same on every attempt:
    more than one ledger effect with one id is a duplicate external effect."""
    ledger = httpx.get(f"{sandbox_url}/ledger", timeout=60).json()["effects"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT external_request_id FROM toolcalls_toolcall")
        ours = {row[0] for row in cursor.fetchall()}
    per_request = Counter(effect["request_id"] for effect in ledger)
    return {
        "effects": len(ledger),
        "duplicates": sum(n - 1 for rid, n in per_request.items() if rid in ours),
        "orphans": sum(n for rid, n in per_request.items() if rid not in ours),
    }


def fencing() -> dict[str, int]:
    """A stale result accepted: an attempt recorded (not refused as stale) after a later claim
    of its call had started. The dispatcher records only with the current fencing token, so
    every recorded attempt must have ended before the next claim."""
    accepted = _one(
        "SELECT count(*) FROM toolcalls_attempt a JOIN toolcalls_attempt b"
        " ON b.tool_call_id = a.tool_call_id AND b.fencing_token > a.fencing_token"
        " WHERE a.classification IN ('confirmed', 'rejected', 'retryable', 'unknown')"
        " AND a.ended_at > b.started_at"
    )
    refused = _one(
        "SELECT count(*) FROM runs_event WHERE event_type = 'tool_call.stale_result_refused'"
    )
    return {"stale_accepted": accepted, "stale_refused": refused}


def approvals() -> dict[str, Any]:
    twice = _one(
        "SELECT count(*) FROM (SELECT approval_id FROM runs_event"
        " WHERE event_type = 'approval.consumed' GROUP BY approval_id HAVING count(*) > 1) t"
    )
    unseen = _one(
        "SELECT count(*) FROM approvals_approval a JOIN toolcalls_toolcall tc"
        " ON tc.id = a.tool_call_id WHERE a.state = 'consumed' AND a.args_digest <> tc.args_digest"
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT state, count(*) FROM approvals_approval GROUP BY state")
        states = dict(cursor.fetchall())
    return {"consumed_twice": twice, "other_args": unseen, "states": states}


def replay(name: str, *args: str) -> tuple[bool, str]:
    """Run one of the log's own checks; (passed, its last line)."""
    close_old_connections()
    out = io.StringIO()
    try:
        call_command(name, *args, stdout=out, stderr=out)
    except CommandError as exc:
        return False, str(exc)
    lines = out.getvalue().strip().splitlines()
    return True, lines[-1] if lines else "no output"


def secrets_in_logs(log_dir: Path, secrets: list[str]) -> dict[str, int]:
    found: Counter[str] = Counter()
    for path in sorted(log_dir.glob("*.log")):
        if path.name in ("sandbox.log", "redis.log"):
            continue  # the external systems' and the broker's own logs, not ours
        text = path.read_text(errors="replace")
        for secret in secrets:
            if secret in text:
                found[path.name] += text.count(secret)
    return dict(found)


@dataclass
class Row:
    what: str
    value: str
    expected: str = ""
    ok: bool | None = None  # None: a figure, not an invariant


def table(rows: list[Row]) -> list[str]:
    width = max(len(row.what) for row in rows)
    lines = [f"  {'':<{width}}  {'value':>14}  {'must be':<10}  held"]
    for row in rows:
        held = "" if row.ok is None else ("yes" if row.ok else "NO")
        lines.append(f"  {row.what:<{width}}  {row.value:>14}  {row.expected:<10}  {held}")
    return lines


def zero(what: str, value: int) -> Row:
    return Row(what, str(value), "0", value == 0)


def passed(what: str, ok: bool) -> Row:
    return Row(what, "ok" if ok else "FAILED", "ok", ok)
