"""Starting and waiting for real processes in tests."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def embedded_env(var_dir: Path) -> dict[str, str]:
    """The environment of a bare machine: no database or broker configured."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE"}
    }
    env["COUNTERSIGN_VAR_DIR"] = str(var_dir)
    env["PYTHONUNBUFFERED"] = "1"
    return env
