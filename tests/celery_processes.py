"""Real Celery worker and beat processes against the test database and Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import redis
from django.conf import settings
from django.db import connection

from tests.helpers import ROOT, children_of, wait_for


def flush_broker() -> None:
    """Leftover messages of an earlier test would be delivered into this one."""
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()


def process_env(sandbox_url: str, **extra: str) -> dict[str, str]:
    db = connection.settings_dict
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.test",
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
        SANDBOX_URL=sandbox_url,
        TOOLCALL_TIMEOUT_OVERRIDE="1",
        LEASE_MARGIN_SECONDS="1",
        SWEEP_INTERVAL_SECONDS="1",
        CELERY_VISIBILITY_TIMEOUT="5",
        CIRCUIT_OPEN_SECONDS="2",
        OUTBOX_REPUBLISH_AFTER_SECONDS="2",
        # A dead or failed drainer's rows come back this soon (runs/drain.py).
        OUTBOX_DRAIN_LEASE_SECONDS="5",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


class CeleryProcess:
    def __init__(
        self, kind: str, name: str, env: dict[str, str], log_dir: Path, queues: str = ""
    ) -> None:
        self.kind, self.name, self.env, self.queues = kind, name, env, queues
        self.log = log_dir / f"{name}.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> CeleryProcess:
        if self.kind == "worker":
            args = [
                "worker",
                "--pool",
                "prefork",
                "--concurrency",
                "1",
                "-n",
                f"{self.name}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                *(["-Q", self.queues] if self.queues else []),
            ]
            ready = "ready."
        else:
            args = ["beat", "-s", str(self.log.with_suffix(".schedule"))]
            ready = "beat: Starting"
        with self.log.open("a") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "config", *args, "--loglevel", "INFO"],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_for(lambda: ready in self.log.read_text(), 30, f"{self.name} to start")
        except AssertionError:
            self.stop()  # never leave an orphan consuming the next test's messages
            raise
        return self

    def children(self) -> list[int]:
        """Pids of the prefork pool's processes (where tasks run)."""
        return children_of(self.process.pid)

    def signal_pool(self, sig: int) -> None:
        for pid in self.children():
            os.kill(pid, sig)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGCONT)
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=5)

    def output(self) -> str:
        return self.log.read_text()
