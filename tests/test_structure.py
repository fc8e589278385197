"""The layout the README describes: apps are layers that import only downwards, and modules
and functions stay small enough to read."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import ROOT

# Bottom to top; an app may import the apps before it in this list, never one after it.
LAYERS = ["runs", "approvals", "toolcalls", "memory", "console"]
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def modules(app: str) -> list[Path]:
    return [p for p in (ROOT / app).rglob("*.py") if "migrations" not in p.parts]


def imported_apps(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found.update(name.split(".")[0] for name in names)
    return found & set(LAYERS)


@pytest.mark.parametrize("app", LAYERS)
def test_an_app_imports_only_the_layers_below_it(app: str) -> None:
    above = set(LAYERS[LAYERS.index(app) + 1 :])
    upwards = {
        str(path.relative_to(ROOT)): sorted(imported_apps(path) & above)
        for path in modules(app)
        if imported_apps(path) & above
    }
    assert upwards == {}


def test_the_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from toolcalls.models import ToolCall\nimport console.urls\n")
    assert imported_apps(module) == {"toolcalls", "console"}


@pytest.mark.parametrize("app", LAYERS)
def test_no_module_is_over_500_lines(app: str) -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in modules(app)
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


@pytest.mark.parametrize("app", LAYERS)
def test_a_function_over_60_lines_says_why(app: str) -> None:
    """A long function carries a `# long: <why>` comment in the lines just above its `def`."""
    unexplained = []
    for path in modules(app):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            length = node.end_lineno - node.lineno + 1
            comments = []
            line = start - 2
            while line >= 0 and lines[line].strip().startswith("#"):
                comments.append(lines[line].strip())
                line -= 1
            explained = any(comment.startswith("# long:") for comment in comments)
            if length > MAX_FUNCTION_LINES and not explained:
                unexplained.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {length}")
    assert unexplained == []


def test_every_collected_test_has_a_nodeid_of_its_own(request: pytest.FixtureRequest) -> None:
    """pytest-xdist hands tests out by nodeid (bin/test): two tests with one id would run once
    (tests/conftest.py pytest_collection_modifyitems, schemathesis's items)."""
    ids = [item.nodeid for item in request.session.items]
    assert [nodeid for nodeid in set(ids) if ids.count(nodeid) > 1] == []
