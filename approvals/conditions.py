"""Policy conditions, evaluated safely: a tiny expression language, never `eval`.

    amount_cents > 20000
    amount_cents > 100000 and currency == "USD"
    sku in ["PART-300", "PART-400"] or quantity >= 10

Names are fields of the call's arguments (dotted for nested objects); literals are numbers,
strings, booleans, null and lists. Comparisons, `in`, `not in`, `and`, `or` and `not` are all
there is. Python's parser builds the tree; only the node types below are walked.
"""

from __future__ import annotations

import ast
import operator
from functools import lru_cache
from typing import Any

_COMPARE = {
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_MISSING = object()


class ConditionError(ValueError):
    """A condition that is not in the language (said when the policy is saved)."""


@lru_cache(maxsize=1024)
def parse(condition: str) -> ast.Expression:
    """The checked tree of a condition; policies are few, so trees are kept per process."""
    try:
        tree = ast.parse(condition.strip(), mode="eval")
    except SyntaxError as exc:
        raise ConditionError(f"cannot read {condition!r}: {exc.msg}") from exc
    _check(tree.body)
    return tree


def _check(node: ast.AST) -> None:
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And | ast.Or):
        for value in node.values:
            _check(value)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        _check(node.operand)
    elif isinstance(node, ast.Compare):
        if not all(type(op) in _COMPARE for op in node.ops):
            raise ConditionError("only > >= < <= == != in, not in compare")
        for value in [node.left, *node.comparators]:
            _check_value(value)
    else:
        raise not_allowed(node)


def not_allowed(node: ast.AST) -> ConditionError:
    # Said in the words of the language, quoting what was written (`amount * 2`), not the
    # parser's node name.
    return ConditionError(
        f"a condition can compare a field with a value; `{ast.unparse(node)}` is not allowed"
    )


def _check_value(node: ast.AST) -> None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float | str | bool):
        return
    if isinstance(node, ast.Constant) and node.value is None:
        return
    if isinstance(node, ast.Name):
        return
    if isinstance(node, ast.Attribute):
        return _check_value(node.value)
    if isinstance(node, ast.List | ast.Tuple):
        for element in node.elts:
            _check_value(element)
        return
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _check_value(node.operand)
    raise not_allowed(node)


def evaluate(condition: str, args: dict[str, Any]) -> bool:
    """True when the condition holds for these arguments. A missing field makes its
    comparison false (never an error at decision time)."""
    return bool(_eval(parse(condition).body, args))


def _eval(node: ast.AST, args: dict[str, Any]) -> Any:
    if isinstance(node, ast.BoolOp):
        results = (_eval(value, args) for value in node.values)
        return all(results) if isinstance(node.op, ast.And) else any(results)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _eval(node.operand, args)
    if isinstance(node, ast.Compare):
        left = _value(node.left, args)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _value(right_node, args)
            if left is _MISSING or right is _MISSING:
                return False
            try:
                if not _COMPARE[type(op)](left, right):
                    return False
            except TypeError:
                return False  # "abc" > 3: not comparable, so not matched
            left = right
        return True
    raise ConditionError(f"{type(node).__name__} is not allowed")


def _value(node: ast.AST, args: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List | ast.Tuple):
        return [_value(element, args) for element in node.elts]
    if isinstance(node, ast.UnaryOp):
        value = _value(node.operand, args)
        return _MISSING if value is _MISSING else -value
    path = []
    while isinstance(node, ast.Attribute):
        path.append(node.attr)
        node = node.value
    path.append(node.id)
    value: Any = args
    for part in reversed(path):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value
