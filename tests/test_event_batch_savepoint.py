"""An event batch refuses what a savepoint opened inside it would append or hand over
(runs/events.py `_batch_here`): the batch's INSERT waits for the end of its block, so a
savepoint's rollback could not take those events back."""

from __future__ import annotations

import pytest
from django.db import transaction

from runs import events
from runs.models import Run

pytestmark = pytest.mark.django_db

_PAYLOAD = {"found": False, "lookup": 1}


def test_an_event_appended_inside_a_savepoint_of_a_batch_is_refused(run: Run) -> None:
    with (
        transaction.atomic(),
        events.batch(),
        pytest.raises(RuntimeError, match="savepoint"),
        transaction.atomic(),  # a savepoint
    ):
        events.append(run=run, event_type="tool_call.looked_up", payload=_PAYLOAD, producer="test")


def test_a_batch_s_events_are_not_handed_over_inside_a_savepoint(run: Run) -> None:
    with transaction.atomic(), events.batch():
        events.append(run=run, event_type="tool_call.looked_up", payload=_PAYLOAD, producer="test")
        with pytest.raises(RuntimeError, match="savepoint"), transaction.atomic():
            events.batch_take_pending()
        assert [e.event_type for e in events.batch_take_pending()] == ["tool_call.looked_up"]


def test_outside_a_batch_nothing_is_pending(run: Run) -> None:
    with transaction.atomic():
        assert events.batch_take_pending() == []
