"""Starting and waiting for real processes in tests."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import redis

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


# As bin/test and .ci/run start it: on loopback, keeping nothing on disk.
REDIS_SERVER = ["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "--port", "6379"]
REDIS_SERVER += ["--save", "", "--appendonly", "no"]


@contextlib.contextmanager
def redis_down(url: str) -> Iterator[None]:
    """Shut the Redis server at `url` down (keeping nothing, as it is run here), then start it
    again the way bin/test and .ci/run do."""
    server = redis.Redis.from_url(url)
    with contextlib.suppress(redis.exceptions.ConnectionError):
        server.shutdown(nosave=True)  # it closes the connection as it goes
    try:
        yield
    finally:
        subprocess.run(REDIS_SERVER, check=True)
        wait_for(lambda: _pings(server), 10, "Redis to start again")


def _pings(server: redis.Redis) -> bool:
    try:
        return bool(server.ping())
    except redis.exceptions.ConnectionError:
        return False


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
