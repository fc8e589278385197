"""The embedded default: `manage.py demo` on SQLite with the in-process worker."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.helpers import ROOT, embedded_env, free_port, wait_for

pytestmark = pytest.mark.slow


def test_the_demo_serves_the_console_runs_the_agent_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    port, sandbox_port = free_port(), free_port()
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        demo = subprocess.Popen(
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
        output = log.read_text()
        assert f"Countersign is running at http://127.0.0.1:{port}/" in output
        assert "log in as alice" in output and "log in as olivia" in output
        assert (tmp_path / "countersign.sqlite3").exists()
    finally:
        demo.send_signal(signal.SIGINT)
        returncode = demo.wait(timeout=30)
    assert returncode == 0, log.read_text()[-2000:]
    assert "Stopped." in log.read_text()
