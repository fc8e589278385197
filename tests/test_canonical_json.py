"""`runs.canonical.canonical_json` writes exactly what rfc8785 writes, or fails where it fails:
its orjson path must never change a hash or a digest already stored."""

from __future__ import annotations

from typing import Any

import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runs import canonical
from runs.canonical import canonical_json

# Every code point, lone surrogates included (orjson refuses them, rfc8785 too).
_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)
_INTS = st.one_of(
    st.integers(-(2**53) - 3, -(2**53) + 3),
    st.integers(2**53 - 3, 2**53 + 3),
    st.integers(-(2**65), 2**65),
    st.integers(-1000, 1000),
)
_SCALARS = st.one_of(st.none(), st.booleans(), _INTS, _TEXT, st.floats(allow_nan=True))
_KEYS = st.one_of(_TEXT, st.sampled_from(["a", "b", "é", "\U0001f600", "\ufb01", "A", ""]))
_TREES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_KEYS, inner, max_size=4)),
    max_leaves=20,
)


def _outcome(dump: Any, value: Any) -> bytes | str:
    try:
        return dump(value)
    except ValueError:  # rfc8785's CanonicalizationError and its kinds
        return "refused"


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_TREES)
def test_canonical_json_is_rfc8785_for_any_tree(value: Any) -> None:
    assert _outcome(canonical_json, value) == _outcome(rfc8785.dumps, value)


@pytest.mark.parametrize(
    "value",
    [
        {"b": 1, "a": [None, True, False, "x"], "": {}},
        {"s": "".join(map(chr, range(0x30))) + '"\\/\x7f\u2028\u2029\ufeff'},
        {"emoji": "\U0001f600", "é": "key outside ASCII", "\ufb01": 1, "\U0001f601": 2},
        {"max": 2**53 - 1, "min": -(2**53) + 1},
        {"past": 2**53},
        {"below": -(2**53)},
        {"float": 2.0, "small": 1e-7, "big": 1e21},
        {"lone": "\ud800"},
        {1: "a key that is not a string"},
        ("a", "tuple"),
        [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["deep"]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
    ],
)
def test_canonical_json_is_rfc8785_at_the_edges(value: Any) -> None:
    assert _outcome(canonical_json, value) == _outcome(rfc8785.dumps, value)


def test_orjson_writes_the_plain_trees_and_nothing_else() -> None:
    assert canonical._plain({"a": [1, "x", None, True, {"b": -2}]})
    assert not canonical._plain({"a": 1.5})
    assert not canonical._plain({"é": 1})
    assert not canonical._plain(("a",))
    deep: Any = "x"
    for _ in range(400):  # orjson's depth limit is 255: rfc8785 writes it
        deep = [deep]
    assert canonical_json(deep) == rfc8785.dumps(deep)
