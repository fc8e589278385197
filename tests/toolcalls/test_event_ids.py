"""Every event about a tool call names that call, its capability and its decision
(toolcalls/writes.py `tool_call_ids`, made once per call and kept on it)."""

from __future__ import annotations

import pytest

from runs.models import Event, Run
from tests.helpers import propose_in
from tests.sandbox_process import Sandbox
from toolcalls.writes import tool_call_ids

pytestmark = pytest.mark.django_db


def test_each_calls_events_name_that_call(run: Run, sandbox: Sandbox) -> None:
    calls = [propose_in(run, intent="first"), propose_in(run, intent="second")]
    for call in calls:
        named = Event.objects.filter(tool_call_id=call.pk).order_by("seq")
        assert [event.event_type for event in named] == [
            "tool_call.proposed",
            "tool_call.authorized",
        ]
        assert {event.capability_id for event in named} == {call.capability_id}
    assert Event.objects.filter(run=run).exclude(tool_call_id="").count() == 4


def test_the_ids_are_those_of_the_call_asked_about(run: Run, sandbox: Sandbox) -> None:
    first, second = propose_in(run, intent="first"), propose_in(run, intent="second")
    assert tool_call_ids(first).tool_call_id == first.pk
    assert tool_call_ids(second).tool_call_id == second.pk
    assert tool_call_ids(second) is tool_call_ids(second)  # made once for the call
