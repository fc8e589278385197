"""runs/statefield.py's `StateField` reads a state as django-fsm's `FSMField` reads it (loaded,
deferred, after a transition), keeps its `protected` rule, and needs no migration."""

from __future__ import annotations

import pytest
from django.db import transaction
from django_fsm import FSMField

from approvals.models import Approval
from runs.models import Run
from runs.statefield import StateField
from tests.helpers import propose_in
from tests.sandbox_process import Sandbox
from toolcalls.models import E, ToolCall, V

pytestmark = pytest.mark.django_db
STATE_FIELDS = [
    (ToolCall, "execution_status"),
    (ToolCall, "verification_status"),
    (Run, "state"),
    (Approval, "state"),
]


def _fsm_read(obj: object, name: str) -> object:
    """The state as django-fsm's own field reads it."""
    return FSMField.get_state(type(obj)._meta.get_field(name), obj)


@pytest.mark.parametrize(("model", "name"), STATE_FIELDS)
def test_the_state_fields_are_state_fields(model: type, name: str) -> None:
    assert isinstance(model._meta.get_field(name), StateField)


def test_it_reads_a_loaded_state_as_django_fsm_does(run: Run, sandbox: Sandbox) -> None:
    call = ToolCall.objects.get(pk=propose_in(run).pk)
    assert call.execution_status == _fsm_read(call, "execution_status") == E.AUTHORIZED
    assert call.verification_status == _fsm_read(call, "verification_status") == V.NOT_OBSERVED
    field = ToolCall._meta.get_field("execution_status")
    assert field.get_state(call) == E.AUTHORIZED
    assert run.state == _fsm_read(run, "state") == Run.State.ACTIVE


def test_it_loads_a_deferred_state_as_django_fsm_does(run: Run, sandbox: Sandbox) -> None:
    proposed = propose_in(run)
    call = ToolCall.objects.only("id").get(pk=proposed.pk)
    assert "execution_status" not in call.__dict__
    assert call.execution_status == E.AUTHORIZED
    other = ToolCall.objects.only("id").get(pk=proposed.pk)
    assert _fsm_read(other, "execution_status") == E.AUTHORIZED
    field = ToolCall._meta.get_field("verification_status")
    assert field.get_state(ToolCall.objects.only("id").get(pk=proposed.pk)) == V.NOT_OBSERVED


def test_it_reads_the_state_a_transition_left(run: Run, sandbox: Sandbox) -> None:
    call = propose_in(run)
    with transaction.atomic():
        call.cancel()
    assert call.execution_status == _fsm_read(call, "execution_status") == E.CANCELLED


def test_a_loaded_state_stays_protected(run: Run, sandbox: Sandbox) -> None:
    call = ToolCall.objects.get(pk=propose_in(run).pk)
    with pytest.raises(AttributeError):
        call.execution_status = E.COMPLETED
    assert call.execution_status == E.AUTHORIZED


def test_migrations_name_django_fsms_field() -> None:
    _, path, _, kwargs = ToolCall._meta.get_field("execution_status").deconstruct()
    assert path == "django_fsm.FSMField"
    assert kwargs["protected"] is True
