"""What the run page says to a person, from the same progress contract the agent reads: the
next step in words (the agent's version names API calls), the run's duration and who runs
it. The lists, the tables and the timeline are written by console/run_rows.py."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from console import formatting
from runs.models import Run
from toolcalls.models import ToolCall


def for_people(
    progress: dict[str, Any], calls: list[ToolCall], links: dict[str, str] | None = None
) -> dict[str, Any]:
    """The progress contract with each item's summary as a person reads it (money as money),
    and where its call's row is on the page (`links`, by call id); the agent's contract
    itself keeps the contract's words."""
    by_id = {call.pk: call for call in calls}
    links = links or {}

    def rewrite(item: dict[str, Any]) -> dict[str, Any]:
        call_id = item["tool_call_id"]
        call = by_id.get(call_id)
        href = links.get(call_id, f"#{call_id}")
        if call is None:
            return {**item, "href": href}
        text = formatting.summary_text(call.capability_id, call.args, item["summary"])
        return {**item, "summary": text, "href": href}

    return {
        **progress,
        **{key: [rewrite(i) for i in progress[key]] for key in ("verified", "open", "failed")},
    }


def next_step_for_people(run: Run, progress: dict[str, Any]) -> str:
    by_kind: dict[str, list[dict]] = {}
    for item in progress["open"]:
        by_kind.setdefault(item["kind"], []).append(item)

    def calls(kind: str) -> str:
        items = by_kind[kind]
        return items[0]["summary"] if len(items) == 1 else f"{len(items)} calls"

    if not run.is_open and run.state != Run.State.NEEDS_HUMAN:
        if progress["open"]:
            return (
                f"Nothing: the run is {run.get_state_display().lower()}; its last calls "
                "settle by themselves."
            )
        return f"Nothing: the run is {run.get_state_display().lower()}."
    if "needs_human" in by_kind:
        return (
            f"An admin resolves {calls('needs_human')} on the unknowns desk: its outcome is "
            "still unknown after every look-up."
        )
    if "result_unknown" in by_kind:
        return (
            f"Countersign is looking up whether {calls('result_unknown')} happened; nothing "
            "is sent again until it knows."
        )
    if "awaiting_approval" in by_kind:
        return f"A person decides {calls('awaiting_approval')} in Approvals."
    for kind in ("in_flight", "verification_pending", "waiting_on_dependencies"):
        if kind in by_kind:
            return f"Nothing to do: {calls(kind)} is on its way."
    if progress["failed"]:
        first = progress["failed"][0]["summary"]
        return f"The agent decides what to do about {first}, which did not succeed."
    if progress["verified"]:
        return "The agent takes its next step, or finishes the run."
    return "The agent proposes its first tool call."


def duration(run: Run, now: datetime) -> timedelta:
    """How long the run has taken: until now while it is open, until its last change after."""
    end = now if run.is_open else run.updated_at
    return end - run.created_at


def agent_of(run: Run) -> str:
    key = run.api_key
    if key is None:
        return "unknown (started without an API key)"
    on_behalf = f" for {key.principal.username}" if key.principal else ""
    return f"{key.name}{on_behalf} (key {key.pk})"
