"""A quick "valid" for the simple JSON Schemas of event payloads, before jsonschema's verdict.

`runs.events.append` validates every payload against its type's schema. jsonschema's
validator walks any schema generically, and that walk was about a tenth of a proposal's CPU
(profile_propose, sampled: two events per proposal). Most payload schemas use only `type`,
`properties`, `required`, `additionalProperties`, `items`, bounds, lengths, patterns and
annotations: for those, `compile_schema`
builds a plain function that says True only for a payload jsonschema accepts. It may say
False for one jsonschema accepts too (a float 1.0 for an integer, a tuple): the caller then
asks jsonschema, which gives the verdict and the messages. A schema with any other keyword
compiles to None: jsonschema alone. tests/test_schema_check.py compares the two.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]

# Exact types where jsonschema is wider (an integer-valued float is an "integer" to it): a
# False here only sends the payload to jsonschema.
_TYPES: dict[str, Check] = {
    "string": lambda value: isinstance(value, str),
    "integer": lambda value: type(value) is int,
    "number": lambda value: type(value) is int or type(value) is float,
    "boolean": lambda value: type(value) is bool,
    "null": lambda value: value is None,
    "object": lambda value: type(value) is dict,
    "array": lambda value: type(value) is list,
}
_STRUCTURE = {"type", "properties", "required", "additionalProperties", "items"}
_BOUNDS = {"minimum", "maximum", "minLength", "maxLength", "pattern"}
# Annotations: they never make an instance invalid.
_NOTES = {"title", "description", "examples", "default", "$comment"}
_KEYWORDS = frozenset(_STRUCTURE | _BOUNDS | _NOTES)
_OBJECT_KEYWORDS = ("properties", "required", "additionalProperties")


def compile_schema(schema: Any) -> Check | None:
    """A function that says True only for instances `schema` accepts; None when the schema
    uses anything beyond the keywords above."""
    if type(schema) is not dict or not schema.keys() <= _KEYWORDS:
        return None
    checks: list[Check] = []
    if "type" in schema:
        names = schema["type"] if type(schema["type"]) is list else [schema["type"]]
        if not names or any(type(name) is not str or name not in _TYPES for name in names):
            return None
        kinds = [_TYPES[name] for name in names]
        if len(kinds) == 1:
            checks.append(kinds[0])
        else:
            checks.append(lambda value: any(kind(value) for kind in kinds))
    if any(keyword in schema for keyword in _OBJECT_KEYWORDS):
        check = _object_check(schema)
        if check is None:
            return None
        checks.append(check)
    if "items" in schema:
        item = compile_schema(schema["items"])
        if item is None:
            return None
        checks.append(lambda value: type(value) is list and all(item(v) for v in value))
    bounds = _bounds(schema)
    if bounds is None:
        return None
    checks.extend(bounds)
    return _all_of(checks)


def _all_of(checks: list[Check]) -> Check:
    # One or two checks (most schemas: a type; an object's type and its properties) called
    # directly: the generator of `all` was most of the quick check's time (profile_dispatch).
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        first, second = checks
        return lambda value: first(value) and second(value)
    return lambda value: all(check(value) for check in checks)


def _bounds(schema: dict[str, Any]) -> list[Check] | None:
    """As jsonschema applies them: bounds to numbers (not booleans), lengths in code points
    and `re.search` patterns to strings; to any other instance they say nothing."""
    checks: list[Check] = []
    for keyword, holds in (("minimum", _at_least), ("maximum", _at_most)):
        if keyword in schema:
            bound = schema[keyword]
            if type(bound) is not int and type(bound) is not float:
                return None
            checks.append(lambda value, bound=bound, holds=holds: holds(value, bound))
    for keyword, holds in (("minLength", _longer), ("maxLength", _shorter)):
        if keyword in schema:
            bound = schema[keyword]
            if type(bound) is not int:
                return None
            checks.append(lambda value, bound=bound, holds=holds: holds(value, bound))
    if "pattern" in schema:
        if type(schema["pattern"]) is not str:
            return None
        search = re.compile(schema["pattern"]).search
        checks.append(lambda value: not isinstance(value, str) or search(value) is not None)
    return checks


def _number(value: Any) -> bool:
    return type(value) is int or type(value) is float


def _at_least(value: Any, bound: float) -> bool:
    return not _number(value) or value >= bound


def _at_most(value: Any, bound: float) -> bool:
    return not _number(value) or value <= bound


def _longer(value: Any, bound: int) -> bool:
    return not isinstance(value, str) or len(value) >= bound


def _shorter(value: Any, bound: int) -> bool:
    return not isinstance(value, str) or len(value) <= bound


def _object_check(schema: dict[str, Any]) -> Check | None:
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    others_allowed = schema.get("additionalProperties", True)
    if type(properties) is not dict or type(required) is not list:
        return None
    if type(others_allowed) is not bool:
        return None
    if any(type(name) is not str for name in required):
        return None
    compiled = {name: compile_schema(sub) for name, sub in properties.items()}
    if any(check is None for check in compiled.values()):
        return None
    subs: dict[Any, Check] = compiled  # type: ignore[assignment]
    # A property whose schema is only a type: a value of exactly such a type is valid without
    # a call (most of an event's values; two calls each were most of this check's).
    exact = {name: _exact_types(sub) for name, sub in properties.items() if _exact_types(sub)}

    def check(value: Any) -> bool:
        # A non-object is left to jsonschema (these keywords would not apply to it).
        if type(value) is not dict:
            return False
        for name in required:
            if name not in value:
                return False
        for name, item in value.items():
            if name in exact and type(item) in exact[name]:
                continue
            sub = subs.get(name)
            if sub is None:
                if others_allowed:
                    continue
                return False
            if not sub(item):
                return False
        return True

    return check


_EXACT = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def _exact_types(schema: Any) -> frozenset[type]:
    """The exact types a schema of nothing but `type` accepts as they are (a subclass, a
    float 1.0 for an integer, goes through its check); empty for any other schema."""
    if type(schema) is not dict or set(schema) - {"type"} or "type" not in schema:
        return frozenset()
    names = schema["type"] if type(schema["type"]) is list else [schema["type"]]
    if not names or any(type(name) is not str or name not in _EXACT for name in names):
        return frozenset()
    return frozenset(kind for name in names for kind in _EXACT[name])
