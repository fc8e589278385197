"""The live stack the framework adapters are proven against (issue 13, point 7): pytest-django's
live server on PostgreSQL, a real Celery worker process on Redis, the sandbox over HTTP; and
agent processes (the examples) that a test can kill and start again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runs.models import User
from tests.helpers import ROOT, approval_of, decide, logged_in, wait_for
from toolcalls.models import ToolCall

# What the examples print last: the tool's answer as the model received it.
RECEIVED = "model received: "



def held_call(**filters: Any) -> ToolCall:
    """The one call the agent proposed (in `run_id=…`, or anywhere), once a person is asked."""
    calls = ToolCall.objects.filter(approvals__isnull=False, **filters).distinct()
    wait_for(calls.exists, 60, "the agent's proposal to wait for a person")
    return calls.get()


def approve_with_an_edit(approver: User, call: ToolCall, amount_cents: int) -> None:
    """Alice approves in the console's endpoint, halving the refund."""
    answer = decide(
        logged_in(approver),
        approval_of({"tool_call_id": call.pk}),
        "edit",
        edit__amount_cents=str(amount_cents),
        reason="half now, the rest after the investigation",
    )
    assert answer.status_code in (200, 302), answer.content[:300]


class AgentProcess:
    """An example agent as its own process, on the live server with the agent's key and this
    checkout's client package."""

    def __init__(self, script: str, state: Path, url: str, token: str, log: Path) -> None:
        self.script, self.state, self.log = ROOT / script, state, log
        self.env = {
            **os.environ,
            "COUNTERSIGN_URL": url,
            "COUNTERSIGN_API_KEY": token,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "client"), str(ROOT)]),
            "PYTHONUNBUFFERED": "1",
            "OPENAI_AGENTS_DISABLE_TRACING": "1",
        }
        self.process: subprocess.Popen | None = None

    def start(self) -> AgentProcess:
        with self.log.open("a") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(self.script), "--state", str(self.state)],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def kill(self) -> None:
        """kill -9: no cleanup, no last words."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def received(self, timeout: float = 90) -> dict[str, Any]:
        """Wait for the agent to finish; what its model received from the tool."""
        assert self.process is not None
        self.process.wait(timeout=timeout)
        assert self.process.returncode == 0, self.output()
        line = next(li for li in self.output().splitlines() if li.startswith(RECEIVED))
        return json.loads(line.removeprefix(RECEIVED))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill()


@pytest.fixture
def agent_process(live_server, tmp_path: Path) -> Iterator[Callable[..., AgentProcess]]:
    started: list[AgentProcess] = []

    def start(script: str, token: str, name: str) -> AgentProcess:
        state = tmp_path / "agent-state.json"
        process = AgentProcess(script, state, live_server.url, token, tmp_path / f"{name}.log")
        started.append(process.start())
        return process

    yield start
    for process in started:
        process.stop()
