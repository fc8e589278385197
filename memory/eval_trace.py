"""The eval-trace projection: one record per finished run, in a schema of its own
(`countersign.eval_trace/1`, docs/eval-trace.schema.json, described in docs/eval-trace.md).

It is derived from the event log only: the run's events are folded in order, each upcast to
its latest version. Fields are copied by name, never wholesale, so what the log holds about
people and credentials stays out: people appear as "person" (approvers numbered within the
run), agents as "agent"; escalation addresses, usernames and key ids are not copied.

A run is finished when its last run transition is an exit: completed,
completed_with_degradation, needs_human, failed_permanently or cancelled. A needs_human run
that a person resumes leaves the projection until it exits again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Max
from django.utils import timezone

from approvals.event_types import APPROVAL_EVENTS
from runs.event_types import RUN_TRANSITION_EVENTS
from runs.events import upcast
from runs.models import ApiKey, Event, Tenant
from toolcalls.event_types import EXECUTION_EVENTS, VERIFICATION_EVENTS

SCHEMA = "countersign.eval_trace/1"
EXIT_TYPES = (
    "completed",
    "completed_with_degradation",
    "needs_human",
    "failed_permanently",
    "cancelled",
)
EXIT_EVENTS = tuple(f"run.{exit_type}" for exit_type in EXIT_TYPES)
EVAL_READ_SCOPE = "eval:read"

Trace = dict[str, Any]
Handler = Callable[[Trace, Event, dict[str, Any]], None]


def key_may_read(api_key: ApiKey) -> bool:
    """Keys read eval traces with the `eval:read` scope, given by name (`*` is every
    capability, not every read)."""
    return EVAL_READ_SCOPE in api_key.scopes


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def _by(actor: str) -> str:
    if actor.startswith("user:"):
        return "person"
    if actor.startswith("api_key:"):
        return "agent"
    return "system"


def new_trace(run_id: str) -> Trace:
    return {
        "schema": SCHEMA,
        "run_id": run_id,
        "title": "",
        "correlation_id": "",
        "started_at": None,
        "finished_at": None,
        "last_event_at": None,
        "exit": None,
        "budgets": {
            "tool_calls": {"max": None, "used": 0},
            "attempts": {"max": None, "used": 0},
            "deadline": None,
        },
        "decisions": [],
        "tool_calls": {},
        "approvals": {},
        "feedback": [],
        "checkpoints": [],
        # Approvers in order of first decision: people are numbered, never named.
        "_people": {},
    }


def fold(trace: Trace, event: Event) -> None:
    """Apply one event of the run (in sequence order) to its trace."""
    handler = HANDLERS.get(event.event_type)
    if handler is not None:
        _version, payload = upcast(event.event_type, event.schema_version, event.payload)
        handler(trace, event, payload)
    trace["last_event_at"] = _iso(event.recorded_at)


def record(trace: Trace) -> dict[str, Any] | None:
    """The finished run's record, or None while the run has not exited."""
    if trace["exit"] is None:
        return None
    out = {key: value for key, value in trace.items() if not key.startswith("_")}
    out["tool_calls"] = list(trace["tool_calls"].values())
    out["approvals"] = list(trace["approvals"].values())
    return out


# --- what each event adds -------------------------------------------------------------------


def _run_started(trace: Trace, event: Event, payload: dict[str, Any]) -> None:
    trace["title"] = payload["title"]
    trace["correlation_id"] = payload["correlation_id"]
    trace["started_at"] = _iso(event.occurred_at)
    budgets = trace["budgets"]
    budgets["tool_calls"]["max"] = payload["max_tool_calls"]
    budgets["attempts"]["max"] = payload["max_attempts"]
    budgets["deadline"] = payload["deadline"]


def _run_transition(trace: Trace, event: Event, payload: dict[str, Any]) -> None:
    if payload["to"] in EXIT_TYPES:
        trace["exit"] = {"type": payload["to"], "reason": payload.get("reason", "")}
        trace["finished_at"] = _iso(event.occurred_at)
    else:  # resumed by a person from needs_human: not finished any more
        trace["exit"] = None
        trace["finished_at"] = None


def _decision(trace: Trace, event: Event, payload: dict[str, Any]) -> None:
    trace["decisions"].append(
        {
            "decision_id": event.decision_id,
            "kind": payload["kind"],
            "version": payload["version"],
            "content": payload["content"],
            "supersedes": payload["supersedes"],
            "recorded_at": _iso(event.occurred_at),
        }
    )


def _proposed(trace: Trace, event: Event, payload: dict[str, Any]) -> None:
    trace["budgets"]["tool_calls"]["used"] += 1
    trace["tool_calls"][event.tool_call_id] = {
        "tool_call_id": event.tool_call_id,
        "capability": payload["capability"],
        "capability_version": payload["capability_version"],
        "intent": payload["intent"],
        "args": payload["args"],
        "args_digest": payload["args_digest"],
        "decision_id": event.decision_id or None,
        "object": {"ref": payload["object_ref"], "revision": payload["object_revision"]},
        "depends_on": payload.get("depends_on", []),
        "compensation_of": payload.get("compensation_of"),
        "proposed_by": _by(event.actor),
        "proposed_at": _iso(event.occurred_at),
        "execution": {"status": "proposed", "history": []},
        "verification": {"status": "not_observed", "history": []},
        "attempts": 0,
        "lookups": 0,
        "external_id": None,
        "edits": [],
    }


def _step(trace: Trace, event: Event, payload: dict[str, Any]) -> dict[str, Any]:
    step = {"from": payload["from"], "to": payload["to"], "at": _iso(event.occurred_at)}
    if payload.get("error_name"):
        step["error_name"] = payload["error_name"]
    if payload.get("reason"):
        step["reason"] = _unnamed(trace, payload["reason"])
    return step


def _unnamed(trace: Trace, text: str) -> str:
    """Some reasons name the person who acted ("arguments edited by alice"); a username may
    be an e-mail address. The trace says "person 1" instead."""
    for username, number in trace["_people"].items():
        text = re.sub(rf"(?<![\w.@-]){re.escape(username)}(?![\w@-])", f"person {number}", text)
    return text


def _execution(trace: Trace, event: Event, payload: dict[str, Any]) -> None:
    call = trace["tool_calls"][event.tool_call_id]
    call["execution"]["status"] = payload["to"]
    call["execution"]["history"].append(_step(trace, event, payload))
    if event.event_type == "tool_call.dispatching":
        call["attempts"] += 1
        trace["budgets"]["attempts"]["used"] += 1
    if event.event_type == "tool_call.accepted" and payload.get("external_id"):
        call["external_id"] = payload["external_id"]


def _verification(trace: Trace, event: Event, payload: dict[str, Any]) -> None:
    call = trace["tool_calls"][event.tool_call_id]
    call["verification"]["status"] = payload["to"]
    call["verification"]["history"].append(_step(trace, event, payload))


def _looked_up(trace: Trace, event: Event, payload: dict[str, Any]) -> None:
    trace["tool_calls"][event.tool_call_id]["lookups"] += 1


def _args_edited(trace: Trace, event: Event, payload: dict[str, Any]) -> None:
    call = trace["tool_calls"][event.tool_call_id]
    call["args"], call["args_digest"] = payload["args"], payload["to_digest"]
    call["edits"].append(
        {
            "from_digest": payload["from_digest"],
            "to_digest": payload["to_digest"],
            "diff": payload["diff"],
            "by": _by(event.actor),
            "at": _iso(event.occurred_at),
        }
    )


def _approval_required(trace: Trace, event: Event, payload: dict[str, Any]) -> None:
    trace["approvals"][event.approval_id] = {
        "approval_id": event.approval_id,
        "tool_call_id": event.tool_call_id,
        "rule": payload["rule"],
        "policy_version": payload["policy_version"],
        "required_approvers": payload["required_approvers"],
        "risk": payload["risk"],
        "args_digest": payload["args_digest"],
        "requested_at": _iso(event.occurred_at),
        "expires_at": payload["expires_at"],
        "state": "pending",
        "decisions": [],
        "history": [],
    }


def _approval_decision(trace: Trace, event: Event, payload: dict[str, Any]) -> None:
    people = trace["_people"]
    approver = people.setdefault(payload["user"], len(people) + 1)
    decision = {
        "approver": approver,
        "decision": payload["decision"],
        "reason": payload.get("reason", ""),
        "summary_hash": payload["summary_hash"],
        "at": _iso(event.occurred_at),
    }
    if payload.get("edit_diff"):
        decision["edit_diff"] = payload["edit_diff"]
    trace["approvals"][event.approval_id]["decisions"].append(decision)


def _approval_transition(trace: Trace, event: Event, payload: dict[str, Any]) -> None:
    approval = trace["approvals"][event.approval_id]
    approval["state"] = payload["to"]
    approval["history"].append(_step(trace, event, payload))


def _feedback(trace: Trace, event: Event, payload: dict[str, Any]) -> None:
    trace["feedback"].append(
        {
            "feedback_id": payload["feedback_id"],
            "about": {"kind": payload["subject_kind"], "id": payload["subject_id"]},
            "by": _by(event.actor),
            "rating": payload["rating"],
            "label": payload["label"],
            "text": payload["text"],
            "at": _iso(event.occurred_at),
        }
    )


def _checkpoint(trace: Trace, event: Event, payload: dict[str, Any]) -> None:
    trace["checkpoints"].append(
        {
            "checkpoint_id": payload["checkpoint_id"],
            "name": payload["name"],
            "version": payload["version"],
            "schema_version": payload["schema_version"],
            "state": payload["state"],
            "step_index": payload["step_index"],
            "at": _iso(event.occurred_at),
        }
    )


HANDLERS: dict[str, Handler] = {
    "run.started": _run_started,
    **{event_type: _run_transition for event_type in RUN_TRANSITION_EVENTS.values()},
    "decision.recorded": _decision,
    "tool_call.proposed": _proposed,
    **{event_type: _execution for event_type in EXECUTION_EVENTS.values()},
    **{event_type: _verification for event_type in VERIFICATION_EVENTS.values()},
    "tool_call.looked_up": _looked_up,
    "tool_call.args_edited": _args_edited,
    "approval.required": _approval_required,
    "approval.decision_recorded": _approval_decision,
    **{event_type: _approval_transition for event_type in APPROVAL_EVENTS.values()},
    "feedback.recorded": _feedback,
    "checkpoint.saved": _checkpoint,
}


# --- serving it -----------------------------------------------------------------------------


def eval_traces(*, tenant: Tenant, since: datetime | None = None) -> Iterator[dict[str, Any]]:
    """The records of the tenant's finished runs with an event recorded at or after `since`,
    oldest `last_event_at` first. A run that changed after it ended (a call verified late,
    feedback) comes again with its new `last_event_at`.

    Events younger than EVAL_TRACE_SETTLE_SECONDS are left for the next read: a transaction
    still committing may hold an event recorded before the newest one served, and a reader
    who goes on from the last `last_event_at` would never see it."""
    until = timezone.now() - timedelta(seconds=settings.EVAL_TRACE_SETTLE_SECONDS)
    settled = Event.objects.filter(tenant=tenant, recorded_at__lt=until)
    exited = settled.filter(event_type__in=EXIT_EVENTS)
    if since is not None:
        exited = exited.filter(run_id__in=settled.filter(recorded_at__gte=since).values("run_id"))
    runs = (
        settled.filter(run_id__in=exited.values("run_id"))
        .values("run_id")
        .annotate(last=Max("recorded_at"))
        .order_by("last", "run_id")
    )
    # Only ids are held; each run's events are read when its record is due.
    for run_id in [row["run_id"] for row in runs]:
        trace = new_trace(run_id)
        for event in settled.filter(run_id=run_id).order_by("seq"):
            fold(trace, event)
        if (finished := record(trace)) is not None:
            yield finished


def jsonl(records: Iterator[dict[str, Any]]) -> Iterator[str]:
    """JSON Lines: one record per line, as the API and the console export stream them."""
    for trace in records:
        yield json.dumps(trace, ensure_ascii=False, separators=(",", ":")) + "\n"
