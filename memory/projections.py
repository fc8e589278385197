"""Run memory rebuilt from the log, compared by `rebuild_projections --verify`.

- checkpoint: every version's run, name, kind, numbers and the digest of its body (the
  stored body is hashed again, so a body changed behind the event's back shows).
- feedback: every feedback fact as recorded.
- eval_trace: the eval-trace records (memory/eval_trace.py) folded from the log, compared
  with what the state tables say of the same finished runs — exit, decisions, each call's
  two statuses and arguments, approvals and their decisions, feedback, checkpoints, attempts.
  A trace that disagrees with the pages people see is drift.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from typing import Any

from django.db.models import Count

from approvals.models import Approval
from memory.eval_trace import EXIT_TYPES, HANDLERS, Handler, new_trace, record
from memory.models import Checkpoint, Feedback
from runs.canonical import digest
from runs.models import Decision, Event, Run
from runs.projections import Projection, Rows, register_projection
from toolcalls.models import Attempt, ToolCall

# --- checkpoints ----------------------------------------------------------------------------


def _stored_checkpoints(run_ids: Collection[str]) -> Rows:
    rows = Checkpoint.objects.filter(run_id__any=run_ids).values(
        "id",
        "run_id",
        "name",
        "kind",
        "version",
        "schema_version",
        "size_bytes",
        "body",
        "archived_at",
    )
    stored: Rows = {}
    for row in rows.iterator():
        body, checkpoint_id = row.pop("body"), row.pop("id")
        archived = row.pop("archived_at") is not None
        stored[checkpoint_id] = {**row, "body_digest": digest(body), "archived": archived}
    return stored


def _checkpoint_saved(rows: Rows, event: Event, payload: dict[str, Any]) -> None:
    rows[payload["checkpoint_id"]] = {
        "run_id": event.run_id,
        "name": payload["name"],
        "kind": payload["kind"],
        "version": payload["version"],
        "schema_version": payload["schema_version"],
        "size_bytes": payload["size_bytes"],
        "body_digest": payload["body_digest"],
        "archived": False,
    }


def _checkpoints_archived(rows: Rows, event: Event, payload: dict[str, Any]) -> None:
    for checkpoint_id in payload["checkpoint_ids"]:
        rows[checkpoint_id]["archived"] = True


register_projection(
    Projection(
        name="checkpoint",
        load_stored=_stored_checkpoints,
        reducers={
            "checkpoint.saved": _checkpoint_saved,
            "checkpoints.archived": _checkpoints_archived,
        },
    )
)

# --- feedback -------------------------------------------------------------------------------

FEEDBACK_COLUMNS = ("run_id", "subject_kind", "subject_id", "rating", "label", "text")


def _stored_feedback(run_ids: Collection[str]) -> Rows:
    facts = Feedback.objects.filter(run_id__any=run_ids)
    return {row.pop("id"): row for row in facts.values("id", *FEEDBACK_COLUMNS)}


def _feedback_recorded(rows: Rows, event: Event, payload: dict[str, Any]) -> None:
    rows[payload["feedback_id"]] = {
        "run_id": event.run_id,
        **{column: payload[column] for column in FEEDBACK_COLUMNS[1:]},
    }


register_projection(
    Projection(
        name="feedback",
        load_stored=_stored_feedback,
        reducers={"feedback.recorded": _feedback_recorded},
    )
)

# --- eval traces ----------------------------------------------------------------------------


def _into_trace(handler: Handler) -> Any:
    def reduce(rows: Rows, event: Event, payload: dict[str, Any]) -> None:
        trace = rows.get(event.run_id)
        if trace is None:
            trace = rows[event.run_id] = new_trace(event.run_id)
        handler(trace, event, payload)

    return reduce


def _trace_summaries(rows: Rows) -> Rows:
    """What of each finished run's trace the state tables also say."""
    summaries: Rows = {}
    for run_id, trace in rows.items():
        trace_record = record(trace)
        if trace_record is None:
            continue
        summaries[run_id] = {
            "exit": trace_record["exit"]["type"],
            "decisions": sorted(d["decision_id"] for d in trace_record["decisions"]),
            "tool_calls": {
                c["tool_call_id"]: [
                    c["execution"]["status"],
                    c["verification"]["status"],
                    c["args_digest"],
                ]
                for c in trace_record["tool_calls"]
            },
            "approvals": {
                a["approval_id"]: [a["state"], len(a["decisions"])]
                for a in trace_record["approvals"]
            },
            "feedback": sorted(f["feedback_id"] for f in trace_record["feedback"]),
            "checkpoints": sorted(c["checkpoint_id"] for c in trace_record["checkpoints"]),
            "attempts_used": trace_record["budgets"]["attempts"]["used"],
        }
    return summaries


def _stored_traces(run_ids: Collection[str]) -> Rows:
    finished = Run.objects.filter(pk__any=run_ids, state__in=EXIT_TYPES, archived_at__isnull=True)
    rows: Rows = {
        run_id: {
            "exit": state,
            "decisions": [],
            "tool_calls": {},
            "approvals": {},
            "feedback": [],
            "checkpoints": [],
            "attempts_used": 0,
        }
        for run_id, state in finished.values_list("id", "state")
    }
    in_finished = {"run_id__any": run_ids, "run__state__in": EXIT_TYPES}
    for run_id, decision_id in Decision.objects.filter(**in_finished).values_list("run_id", "id"):
        rows[run_id]["decisions"].append(decision_id)
    calls = ToolCall.objects.filter(**in_finished).values_list(
        "run_id", "id", "execution_status", "verification_status", "args_digest"
    )
    for run_id, call_id, execution, verification, args_digest in calls:
        rows[run_id]["tool_calls"][call_id] = [execution, verification, args_digest]
    approvals = (
        Approval.objects.filter(**in_finished)
        .annotate(decided=Count("decisions"))
        .values_list("run_id", "id", "state", "decided")
    )
    for run_id, approval_id, state, decided in approvals:
        rows[run_id]["approvals"][approval_id] = [state, decided]
    for model, column in ((Feedback, "feedback"), (Checkpoint, "checkpoints")):
        for run_id, ident in model.objects.filter(**in_finished).values_list("run_id", "id"):
            rows[run_id][column].append(ident)
    attempts = defaultdict(int)
    for run_id, count in (
        Attempt.objects.filter(**in_finished).values("run_id").annotate(n=Count("id"))
    ).values_list("run_id", "n"):
        attempts[run_id] = count
    for run_id, row in rows.items():
        row["attempts_used"] = attempts[run_id]
        for column in ("decisions", "feedback", "checkpoints"):
            row[column].sort()
    return rows


register_projection(
    Projection(
        name="eval_trace",
        load_stored=_stored_traces,
        reducers={event_type: _into_trace(handler) for event_type, handler in HANDLERS.items()},
        finish=_trace_summaries,
    )
)
