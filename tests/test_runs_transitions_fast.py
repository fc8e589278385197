"""runs/transitions.py takes a simple transition itself, as django-fsm would: the same target
from every source, the same refusals, and django-fsm's own path whenever a transition has
conditions or a receiver listens to its signals."""

from __future__ import annotations

import copy
import cProfile
import pstats
from typing import Any

import pytest
from django_fsm import FSMMeta, can_proceed
from django_fsm.signals import post_transition, pre_transition

from runs import transitions
from runs.statefield import StateField
from toolcalls.event_types import EXECUTION_EVENTS, VERIFICATION_EVENTS
from toolcalls.models import E, ToolCall, V

_FIELDS = {"execution_status": list(E), "verification_status": list(V)}


def _call(**states: str) -> ToolCall:
    call = ToolCall(execution_status=E.AUTHORIZED, verification_status=V.NOT_OBSERVED)
    call.__dict__.update(states)
    return call


def _without_state(call: ToolCall) -> dict[str, Any]:
    return {k: v for k, v in call.__dict__.items() if k not in ("_state", "_django_version")}


def _by_django_fsm(call: ToolCall, action: str) -> str | None:
    method = getattr(call, action)
    if not can_proceed(method):
        return None
    method()
    return "taken"


def _cases() -> list[tuple[str, str, str]]:
    found = []
    for action in [*EXECUTION_EVENTS, *VERIFICATION_EVENTS]:
        field = "verification_status" if action in VERIFICATION_EVENTS else "execution_status"
        for state in _FIELDS[field]:
            found.append((action, field, str(state)))
    return found


@pytest.mark.parametrize(("action", "field", "state"), _cases())
def test_every_tool_call_transition_ends_where_django_fsm_ends_it(
    action: str, field: str, state: str
) -> None:
    direct = _call(**{field: state})
    fsm = copy.copy(direct)
    taken = transitions._transition(direct, action, state)
    expected = _by_django_fsm(fsm, action)
    assert taken == (expected is not None)
    assert getattr(direct, field) == getattr(fsm, field)
    assert type(getattr(direct, field)) is type(getattr(fsm, field))
    assert _without_state(direct) == _without_state(fsm)


def test_a_tool_calls_transition_is_taken_without_django_fsms_path() -> None:
    call = _call(execution_status=E.DISPATCHING)
    profile = cProfile.Profile()
    assert profile.runcall(transitions._transition, call, "accept", E.DISPATCHING)
    assert call.execution_status == E.ACCEPTED
    names = {name for (_, _, name) in pstats.Stats(profile).stats}  # type: ignore[attr-defined]
    assert "can_proceed" not in names and "change_state" not in names
    assert pstats.Stats(profile).total_calls <= 5  # type: ignore[attr-defined]  # before: 21


def test_a_receiver_of_django_fsms_signals_gets_them() -> None:
    heard: list[tuple[str, Any, Any]] = []

    def before(sender: Any, **kwargs: Any) -> None:
        heard.append(("pre", kwargs["source"], kwargs["target"]))

    def after(sender: Any, **kwargs: Any) -> None:
        heard.append(("post", kwargs["source"], kwargs["target"]))

    pre_transition.connect(before, weak=False)
    post_transition.connect(after, weak=False)
    try:
        call = _call(execution_status=E.DISPATCHING)
        assert transitions._transition(call, "accept", E.DISPATCHING)
    finally:
        pre_transition.disconnect(before)
        post_transition.disconnect(after)
    assert heard == [("pre", E.DISPATCHING, E.ACCEPTED), ("post", E.DISPATCHING, E.ACCEPTED)]
    assert call.execution_status == E.ACCEPTED


def test_a_transition_with_conditions_takes_django_fsms_path() -> None:
    # No model here has one yet: a machine made by hand, its condition refusing.
    field = StateField(default="a")
    field.name = field.attname = "state"

    def go(self: Any) -> None:
        pass

    meta = FSMMeta(field=field, method=go)
    meta.add_transition(go, "a", "b", conditions=[lambda instance: False])
    go._django_fsm = meta  # type: ignore[attr-defined]
    machine = type("Machine", (), {"go": go})
    assert transitions._direct(machine, "go") is None
    instance = machine()
    instance.__dict__["state"] = "a"
    assert not transitions._transition(instance, "go", "a")  # the condition said no
    assert instance.__dict__["state"] == "a"
