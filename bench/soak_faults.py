"""What `manage.py soak` does to the system: it kills and pauses worker processes, restarts
its own Redis server, cuts (or restarts) the database's connections, and turns the sandbox's
lost requests and responses on. Every fault is its own to make: the Redis server is one it
started, the connections it cuts are those of its own database."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import redis

from bench import pgstats
from bench.procs import Child, start_worker, wait_for

# The sandbox's fault injection while faults are on (sandbox/README.md): every system loses
# 10% of answers after committing and 5% of requests before.
SANDBOX_FAULTS = {
    "system": "*",
    "drop_response_after_commit": 0.10,
    "drop_request_before_commit": 0.05,
}


def redis_pings(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=0.5).ping())
    except redis.exceptions.RedisError:
        return False


class PrivateRedis:
    """A redis-server of the soak's own on a free port, keeping nothing on disk, so that
    restarting it (and losing every message in it) harms nobody else."""

    def __init__(self, port: int, workdir: Path, log_dir: Path) -> None:
        argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", str(workdir), "--daemonize", "no"]
        self.url = f"redis://127.0.0.1:{port}/0"
        self.child = Child("redis", argv, dict(os.environ), workdir, log_dir / "redis.log")

    def start(self) -> PrivateRedis:
        self.child.start()
        wait_for(lambda: redis_pings(self.url), 15, "the soak's redis-server")
        return self

    def stop(self) -> None:
        self.child.stop(timeout=5)

    def restart(self, down_seconds: float = 2.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()


@dataclass
class Workers:
    """The worker processes. A kill is SIGKILL to the worker's process group (the main process
    and its pool), as an OOM kill of its container would be; a pause is SIGSTOP to the group."""

    root: Path
    env: dict[str, str]
    log_dir: Path
    pool: str
    concurrency: int
    started: list[Child] = field(default_factory=list)  # every one, for the log scan
    live: list[Child] = field(default_factory=list)
    paused: dict[int, float] = field(default_factory=dict)  # pid -> when to resume

    def start_one(self) -> Child:
        index = len(self.started) + 1
        child = start_worker(
            self.root,
            self.env,
            self.log_dir,
            index,
            self.pool,
            self.concurrency,
            app="bench.soak_app",
            prefix="soak",
        )
        self.started.append(child)
        self.live.append(child)
        return child

    def kill(self, rng: random.Random) -> str:
        """SIGKILL a random worker and start a new one in its place."""
        victim = rng.choice(self.live)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(victim.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            victim.process.wait(timeout=5)
        self.live.remove(victim)
        self.paused.pop(victim.pid, None)
        return f"killed {victim.name}, started {self.start_one().name}"

    def pause(self, rng: random.Random, seconds: float) -> str:
        """SIGSTOP a random running worker for `seconds`."""
        running = [w for w in self.live if w.pid not in self.paused]
        if not running:
            return ""
        worker = rng.choice(running)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGSTOP)
        self.paused[worker.pid] = time.monotonic() + seconds
        return f"paused {worker.name} for {seconds:.0f} s"

    def resume_due(self, everyone: bool = False) -> None:
        now = time.monotonic()
        for pid, until in list(self.paused.items()):
            if everyone or until <= now:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGCONT)
                del self.paused[pid]

    def replace_dead(self) -> list[str]:
        """A worker that died by itself is replaced too (and said so)."""
        said = []
        for worker in [w for w in self.live if not w.alive()]:
            self.live.remove(worker)
            said.append(f"{worker.name} exited by itself; started {self.start_one().name}")
        return said

    def stop_all(self) -> None:
        self.resume_due(everyone=True)
        for worker in self.started:
            worker.stop(timeout=10)


def cut_connections(database_url: str) -> int:
    """What a failover does to every session of the soak's database: terminate them."""
    name = pgstats.database_name(database_url)
    with psycopg.connect(pgstats.admin_conninfo(database_url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        ).fetchone()
    return int(row[0])


def restart_postgres(command: str, database_url: str) -> str:
    """Run the operator's restart command, then wait until the server takes connections."""
    done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=180)
    if done.returncode:
        return f"--pg-restart-cmd exited {done.returncode}: {done.stderr.strip()[-300:]}"

    def accepts() -> bool:
        try:
            psycopg.connect(pgstats.admin_conninfo(database_url), connect_timeout=2).close()
            return True
        except psycopg.Error:
            return False

    wait_for(accepts, 120, "PostgreSQL to accept connections after its restart", interval=0.5)
    return "PostgreSQL restarted"


def sandbox_faults(sandbox_url: str, on: bool) -> None:
    if on:
        httpx.post(f"{sandbox_url}/faults", json=SANDBOX_FAULTS, timeout=10).raise_for_status()
    else:
        httpx.delete(f"{sandbox_url}/faults", timeout=10).raise_for_status()


@dataclass(order=True)
class Fault:
    at: float  # seconds into the fault window
    kind: str  # pause | redis_restart | db_cut | pg_restart


def plan(rng: random.Random, window: float, counts: dict[str, int]) -> list[Fault]:
    """Each kind spread evenly over the window, with some jitter."""
    faults = []
    for kind, count in counts.items():
        step = window / (count + 1)
        for number in range(1, count + 1):
            faults.append(Fault(number * step + rng.uniform(-step / 4, step / 4), kind))
    return sorted(faults)


def next_kill_in(rng: random.Random) -> float:
    return rng.uniform(5, 20)


def last_task(worker: Child) -> str:
    """The time and name of the last task `worker` logged as finished ("succeeded" or
    "raised"), read from its log; "none" if it finished none."""
    last = "none"
    for line in worker.output().splitlines():
        if "celery.app.trace" not in line or not (" succeeded in " in line or " raised " in line):
            continue
        with contextlib.suppress(ValueError, KeyError):
            record = json.loads(line)
            last = f"{record['timestamp'][11:23]} {record['message'].split('[', 1)[0]}"
    return last
