"""`manage.py demo --agent langgraph` (what `bin/demo --agent langgraph` runs): the LangGraph
example runs against the demo's own console instead of the scripted agent. A person approves
its refund with an edit through the console's pages over HTTP, and the agent goes on."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.helpers import ROOT, embedded_env, free_port, popen_as_from_a_terminal, wait_for

pytestmark = pytest.mark.slow


def approve_with_an_edit(base_url: str, password: str, approval_url: str) -> None:
    """Log in as alice and post the approval page's edit form, as her browser would."""
    with httpx.Client(base_url=base_url, follow_redirects=True, timeout=10) as http:
        http.get("/login/")
        login = {"username": "alice", "password": password}
        http.post("/login/", data={**login, "csrfmiddlewaretoken": http.cookies["csrftoken"]})
        page = http.get(approval_url).text
        form = {
            "version": re.search(r'name="version" value="([^"]+)"', page).group(1),
            "summary_hash": re.search(r'name="summary_hash" value="([^"]+)"', page).group(1),
            "edit__amount_cents": "15000",
            "reason": "half now",
            "csrfmiddlewaretoken": http.cookies["csrftoken"],
        }
        assert http.post(approval_url + "edit/", data=form).status_code == 200


def test_the_demo_runs_the_langgraph_agent_and_it_goes_on_after_the_approval(
    tmp_path: Path,
) -> None:
    port, sandbox_port = free_port(), free_port()
    command = [sys.executable, "manage.py", "demo", "--agent", "langgraph"]
    command += ["--port", str(port), "--sandbox-port", str(sandbox_port)]
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        demo = popen_as_from_a_terminal(
            command, cwd=ROOT, env=embedded_env(tmp_path), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_for(lambda: "'parked'" in log.read_text(), 90, "the LangGraph agent to park")
        approval_url = re.search(r"'approval_url': '([^']+)'", log.read_text()).group(1)
        assert approval_url.startswith(f"http://127.0.0.1:{port}/approvals/apr_")
        logins = (tmp_path / "demo-logins.txt").read_text()
        password = re.search(r"log in as alice\s+password (\S+)", logins).group(1)

        approve_with_an_edit(f"http://127.0.0.1:{port}", password, approval_url)

        wait_for(lambda: "Countersign: succeeded" in log.read_text(), 90, "the agent's answer")
        answer = next(
            line for line in log.read_text().splitlines() if "Countersign: succeeded" in line
        )
        assert "langgraph agent, demo-" in answer
        assert "alice edited the call before it ran (reason: half now)" in answer
        assert "amount_cents 25000 -> 15000" in answer
    finally:
        demo.send_signal(signal.SIGINT)
        returncode = demo.wait(timeout=30)
    assert returncode == 0, log.read_text()[-2000:]


def test_an_unknown_agent_lists_the_choices(tmp_path: Path) -> None:
    refused = subprocess.run(
        [sys.executable, "manage.py", "demo", "--agent", "crewai"],
        cwd=ROOT,
        env=embedded_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert "invalid choice: 'crewai' (choose from 'langgraph', 'scripted')" in refused.stderr
