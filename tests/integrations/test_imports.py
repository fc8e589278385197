"""The core client depends on httpx only: importing `countersign` loads no agent framework;
each adapter loads its own when it is imported."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT

FRAMEWORKS = ("agents", "pydantic_ai", "langgraph", "mcp")


def loaded_after(statement: str) -> set[str]:
    probe = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT / "client",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {name for name in out.split() if name in FRAMEWORKS}


def test_the_core_client_loads_no_framework() -> None:
    assert loaded_after("import countersign") == set()


def test_each_adapter_loads_its_framework_and_not_the_others() -> None:
    # The Agents SDK imports `mcp` itself.
    openai_agents = loaded_after("import countersign.openai_agents")
    assert "agents" in openai_agents and "pydantic_ai" not in openai_agents
    pydantic_ai = loaded_after("import countersign.pydantic_ai")
    assert "pydantic_ai" in pydantic_ai and "agents" not in pydantic_ai
