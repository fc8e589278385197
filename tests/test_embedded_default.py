"""The embedded default: `manage.py demo` on SQLite with the in-process worker."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.helpers import ROOT, embedded_env, free_port, popen_as_from_a_terminal, wait_for

pytestmark = pytest.mark.slow


def test_the_demo_serves_the_console_runs_the_agent_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    port, sandbox_port = free_port(), free_port()
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        demo = popen_as_from_a_terminal(
            [
                sys.executable,
                "manage.py",
                "demo",
                "--port",
                str(port),
                "--sandbox-port",
                str(sandbox_port),
            ],
            cwd=ROOT,
            env=embedded_env(tmp_path),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def login_page_served() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/login/", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(login_page_served, 60, "the demo's login page")
        page = httpx.get(f"http://127.0.0.1:{port}/login/").text
        assert "Log in" in page
        # The agent's refund went through the in-process worker and was verified.
        wait_for(
            lambda: "completed / confirmed_success" in log.read_text(),
            60,
            "the scripted agent's refund to be confirmed",
        )
        # Its third round is the spare-part flow, shipping to an address the carrier refuses:
        # the reservation made before is released (compensation).
        wait_for(
            lambda: "address refused; reservation released" in log.read_text(),
            90,
            "the refused address to release the reservation",
        )
        # Approvers are e-mailed a link to the console this demo serves, on its real port.
        wait_for(
            lambda: f"Decide here: http://127.0.0.1:{port}/approvals/apr_" in log.read_text(),
            60,
            "an approval e-mail with a link to this console",
        )
        # The agent ends its runs once their calls settle, with the exit type they earned.
        wait_for(
            lambda: "finished: completed" in log.read_text(),
            60,
            "the scripted agent to finish a run",
        )
        # A second demo on the same port refuses to start, and says which flag to use.
        second = subprocess.run(
            [sys.executable, "manage.py", "demo", "--port", str(port)],
            cwd=ROOT,
            env=embedded_env(tmp_path / "second"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode != 0
        assert f"Port {port} is in use" in second.stderr
        assert f"manage.py demo --port {port + 1}" in second.stderr
        output = log.read_text()
        assert f"Countersign is running at http://127.0.0.1:{port}/" in output
        assert "log in as alice" in output and "log in as olivia" in output
        logins = (tmp_path / "demo-logins.txt").read_text()
        assert "log in as alice" in logins and f"http://127.0.0.1:{port}/" in logins
        assert " INFO celery" not in output  # the worker's task lines stay out of the terminal
        assert (tmp_path / "countersign.sqlite3").exists()
    finally:
        demo.send_signal(signal.SIGINT)
        returncode = demo.wait(timeout=30)
    assert returncode == 0, log.read_text()[-2000:]
    assert "Stopped." in log.read_text()


def test_sigterm_stops_the_demo_and_its_sandbox(tmp_path: Path) -> None:
    port, sandbox_port = free_port(), free_port()
    demo = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "demo",
            "--no-agent",
            "--port",
            str(port),
            "--sandbox-port",
            str(sandbox_port),
        ],
        cwd=ROOT,
        env=embedded_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: answers(f"http://127.0.0.1:{port}/login/"), 60, "the demo's console")
        assert answers(f"http://127.0.0.1:{sandbox_port}/health")
    finally:
        demo.send_signal(signal.SIGTERM)
        returncode = demo.wait(timeout=30)
    assert returncode == 0
    # The sandbox child went with it: nothing answers on its port any more.
    assert not answers(f"http://127.0.0.1:{sandbox_port}/health")


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
