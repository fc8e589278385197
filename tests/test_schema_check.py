"""runs/schema_check.py says "valid" only where jsonschema does, so `runs.events.validate`
gives jsonschema's verdict (and messages) for every payload, and the quick check is used for
the event types that appends hit most."""

from __future__ import annotations

import cProfile
import pstats
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runs import events
from runs.schema_check import compile_schema

_TYPE_NAMES = ["string", "integer", "number", "boolean", "null", "object", "array"]
_NAMES = st.sampled_from(["a", "b", "from", "to", "reason", "n"])


def _schemas(depth: int = 2) -> st.SearchStrategy[dict[str, Any]]:
    types = st.one_of(
        st.sampled_from(_TYPE_NAMES), st.lists(st.sampled_from(_TYPE_NAMES), max_size=3)
    )
    bounds = {
        "minimum": st.one_of(st.integers(-2, 2), st.floats(-2, 2)),
        "maximum": st.one_of(st.integers(-2, 2), st.floats(-2, 2)),
        "minLength": st.integers(0, 3),
        "maxLength": st.integers(0, 3),
        "pattern": st.sampled_from(["^a", "b$", "[0-9]{2}", ""]),
        "title": st.just("annotation"),
        "enum": st.just([1, "a"]),
    }
    leaf = st.fixed_dictionaries({}, optional={"type": types, **bounds})
    if depth == 0:
        return leaf
    inner = _schemas(depth - 1)
    node = st.fixed_dictionaries(
        {},
        optional={
            "type": types,
            "properties": st.dictionaries(_NAMES, inner, max_size=4),
            "required": st.lists(_NAMES, max_size=3),
            "additionalProperties": st.booleans(),
            "items": inner,
            **bounds,
        },
    )
    return st.one_of(leaf, node)


_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.floats(-2, 2), st.sampled_from([1.0, ""])
)
_TEXTS = st.one_of(st.text(max_size=3), st.sampled_from(["a1", "12", "ab", "\u00e9\U0001f600"]))
_INSTANCES = st.recursive(
    st.one_of(_SCALARS, _TEXTS),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner),
        st.dictionaries(st.one_of(_NAMES, st.just("other")), inner, max_size=4),
    ),
    max_leaves=12,
)


@settings(max_examples=4000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_schemas(), _INSTANCES)
def test_the_quick_check_says_valid_only_where_jsonschema_does(
    schema: dict[str, Any], instance: Any
) -> None:
    quick = compile_schema(schema)
    if "enum" in str(schema) or "'type': []" in str(schema):
        assert quick is None  # what it does not know: jsonschema alone
        return
    assert quick is not None
    if quick(instance):
        assert jsonschema.Draft202012Validator(schema).is_valid(instance)


def test_it_leaves_to_jsonschema_what_it_does_not_know() -> None:
    assert compile_schema({"type": "string", "format": "date-time"}) is None
    assert compile_schema({"type": "object", "properties": {"a": {"enum": [1]}}}) is None
    assert compile_schema({"type": "decimal"}) is None
    assert compile_schema({"additionalProperties": {"type": "string"}}) is None
    assert compile_schema(True) is None


@pytest.mark.parametrize("event_type", ["tool_call.proposed", "tool_call.authorized"])
def test_a_proposals_events_take_the_quick_check(event_type: str) -> None:
    assert events._QUICK[(event_type, 1)] is not None


def test_validate_still_refuses_with_jsonschemas_messages() -> None:
    payload = {"from": "proposed", "to": "authorized", "attempt": "one", "extra": 1}
    with pytest.raises(events.EventSchemaError) as refused:
        events.validate("tool_call.authorized", 1, payload)
    assert "attempt: 'one' is not of type 'integer'" in str(refused.value)
    assert "'extra' was unexpected" in str(refused.value)
    # jsonschema's wider "integer" (2.0) still passes, through jsonschema.
    events.validate("tool_call.authorized", 1, {"from": "a", "to": "b", "attempt": 2.0})


def test_the_capabilities_arguments_take_the_quick_check() -> None:
    from toolcalls import capabilities

    assert capabilities.get("refund-order-v2").quick_check is not None  # bench_dispatch's
    for capability in capabilities.REGISTRY.values():
        for example in capability.input_schema.get("examples", []):
            assert capability.validate(example) == []
            assert capability.quick_check is None or capability.quick_check(example)


class _Status(str):
    """A str subclass, as a status (TextChoices) is: a string to jsonschema."""


_VALUES = [
    True,
    False,
    0,
    7,
    -1,
    1.0,
    2.5,
    "",
    "a1",
    _Status("ok"),
    None,
    {},
    {"a": 1},
    [],
    [1],
    (),
]
_PROPERTY_SCHEMAS = [
    *({"type": name} for name in _TYPE_NAMES),
    {"type": ["string", "null"]},
    {"type": ["integer", "boolean"], "description": "annotations say nothing"},
    {"type": "integer", "minimum": 0},
    {"type": "string", "minLength": 1},
    {"type": "string", "pattern": "^a"},
    {"type": "object", "properties": {"a": {"type": "string"}}},
    {"type": "array", "items": {"type": "integer"}},
    {"minimum": 1},
]


@pytest.mark.parametrize("sub", _PROPERTY_SCHEMAS, ids=str)
def test_a_property_s_value_passes_the_quick_check_only_where_jsonschema_takes_it(
    sub: dict[str, Any],
) -> None:
    # A property's value of exactly its type passes without its check being called; any
    # other value is asked of the check. Both must agree with jsonschema.
    schema = {"type": "object", "properties": {"p": sub}, "required": ["p"]}
    quick = compile_schema(schema)
    assert quick is not None
    validator = jsonschema.Draft202012Validator(schema)
    for value in _VALUES:
        if quick({"p": value}):
            assert validator.is_valid({"p": value}), value
    exact = {"string": "a1", "integer": 7, "number": 2.5, "boolean": True, "null": None}
    exact.update(object={}, array=[1])
    if sub.keys() - {"description"} == {"type"} and type(sub["type"]) is str:
        assert quick({"p": exact[sub["type"]]})  # a value of its very type passes


def test_values_of_exactly_their_types_are_checked_without_a_call_each() -> None:
    check = compile_schema(
        {
            "type": "object",
            "required": ["from", "to"],
            "properties": {
                "from": {"type": "string"},
                "to": {"type": "string"},
                "attempt": {"type": "integer"},
                "note": {"type": ["string", "null"]},
                "short": {"type": "string", "maxLength": 3},
            },
            "additionalProperties": False,
        }
    )
    assert check is not None
    payload = {"from": "a", "to": "b", "attempt": 2, "note": None, "short": "abc"}
    profile = cProfile.Profile()
    assert profile.runcall(check, payload)
    # The object's checks and `short`'s type and bound (13 calls); before: two more for each
    # of the other four values (30).
    assert pstats.Stats(profile).total_calls <= 14  # type: ignore[attr-defined]
    assert not check({**payload, "attempt": True})  # a boolean is no integer: the long way
    assert not check({**payload, "short": "abcd"})
