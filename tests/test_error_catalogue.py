"""Error names are stable and dotted, and each lives in one catalogue per app
(runs/errors.py, approvals/errors.py, toolcalls/errors.py, memory/errors.py): no code raises a
name written out in place, where a typo would make a new name nobody documented."""

from __future__ import annotations

import ast
import re

import pytest

from approvals import errors as approval_errors
from memory import errors as memory_errors
from runs import errors as run_errors
from tests.helpers import ROOT
from toolcalls import errors as toolcall_errors

CATALOGUES = [run_errors, approval_errors, toolcall_errors, memory_errors]
DOTTED = re.compile(r"^[a-z_]+\.[a-z0-9_]+$")


def catalogue_names() -> dict[str, str]:
    names = {}
    for module in CATALOGUES:
        for attribute, value in vars(module).items():
            if attribute.isupper() and isinstance(value, str):
                names[f"{module.__name__}.{attribute}"] = value
    return names


def test_every_catalogued_name_is_dotted_and_named_once() -> None:
    names = catalogue_names()
    assert [value for value in names.values() if not DOTTED.match(value)] == []
    assert len(set(names.values())) == len(names)


def literal_error_names(source: str) -> list[str]:
    """String literals given as the name of a DomainError or of an API refusal."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        callee = (
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        )
        # The name is the first argument of these, the third of error_response(request, status,
        # name, message).
        position = {"DomainError": 0, "_refusal": 0, "error_response": 2}.get(callee)
        if position is None or len(node.args) <= position:
            continue
        name = node.args[position]
        if isinstance(name, ast.Constant) and isinstance(name.value, str):
            found.append(name.value)
    return found


def test_the_scan_finds_a_name_written_in_place() -> None:
    assert literal_error_names('raise DomainError("run.closd", "typo")') == ["run.closd"]
    assert literal_error_names('error_response(request, 400, "request.bad", "m")') == [
        "request.bad"
    ]


@pytest.mark.parametrize("app", ["runs", "approvals", "toolcalls", "memory", "console", "config"])
def test_no_error_name_is_written_in_place(app: str) -> None:
    written = {
        str(path.relative_to(ROOT)): names
        for path in (ROOT / app).rglob("*.py")
        if "migrations" not in path.parts and (names := literal_error_names(path.read_text()))
    }
    assert written == {}
