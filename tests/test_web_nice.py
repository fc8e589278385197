"""WEB_NICE: the Procfile's `api` line (the agents' web process) runs gunicorn below normal CPU
priority, so that on saturated cores the console's `web` line is scheduled first (issue 12;
bench_approve --load dispatch measures the click). A real gunicorn, in a session of its own as
a supervisor starts it; the nice values are read from /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.helpers import (
    ROOT,
    autogroup_nice,
    children_of,
    free_port,
    nice_of_every_thread,
    wait_for,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def start_gunicorn(tmp_path: Path):
    started: list[subprocess.Popen] = []

    def start(**env: str) -> subprocess.Popen:
        port = free_port()
        argv = [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.py", "config.wsgi"]
        argv += ["--bind", f"127.0.0.1:{port}", "--workers", "2"]
        process = subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=(tmp_path / "gunicorn.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started.append(process)
        url = f"http://127.0.0.1:{port}/login/"
        wait_for(
            lambda: _answers(url) and len(children_of(process.pid)) == 2, 30, "gunicorn's workers"
        )
        return process

    yield start
    for process in started:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_api_process_runs_its_master_and_workers_below_normal(start_gunicorn) -> None:
    base = os.nice(0)
    master = start_gunicorn(WEB_NICE="10")
    for pid in [master.pid, *children_of(master.pid)]:
        assert nice_of_every_thread(pid) == {base + 10}
    # Its session's group too: under autogroup scheduling that is what ranks it.
    assert autogroup_nice(master.pid) == 10


def test_the_console_process_runs_at_normal_priority(start_gunicorn) -> None:
    base = os.nice(0)
    master = start_gunicorn()
    for pid in [master.pid, *children_of(master.pid)]:
        assert nice_of_every_thread(pid) == {base}
    assert autogroup_nice(master.pid) == 0
