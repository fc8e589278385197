"""Dispatch of a batch of authorized calls, as the outbox drainer hands them over."""

from __future__ import annotations

from toolcalls import dispatch


def tool_calls_dispatch_batch(items: list[tuple[str, str | None]]) -> None:
    """(tool_call_id, outbox_id) pairs, each dispatched as `toolcalls.dispatch` would.

    The placeholder: one call after another. The batched claim (FOR UPDATE SKIP LOCKED),
    concurrent sends and one recording transaction per batch (issue 12 point 2) replace it."""
    for tool_call_id, outbox_id in items:
        dispatch.tool_call_dispatch(tool_call_id=tool_call_id, outbox_id=outbox_id)
