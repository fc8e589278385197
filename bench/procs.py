"""Child processes of the benchmark: the sandbox, Celery workers, and their memory."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(check, timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


class Child:
    """A process in its own session, stopped with SIGTERM then SIGKILL (the whole group)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], cwd: Path, log: Path):
        self.name, self.argv, self.env, self.cwd, self.log = name, argv, env, cwd, log
        self.process: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> Child:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, timeout: float = 20) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        # Pool children that outlived their parent go too: the group is ours alone.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


def start_sandbox(
    root: Path, env: dict[str, str], data_dir: Path, log_dir: Path, extra: Sequence[str] = ()
) -> tuple:
    """The sandbox on a free port (`extra`: more of its options); returns (child, url)."""
    port = free_port()
    argv = [sys.executable, "-m", "sandbox", "--port", str(port)]
    argv += ["--data-dir", str(data_dir), "--quiet", *extra]
    child = Child("sandbox", argv, env, root, log_dir / "sandbox.log").start()
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if not child.alive():
            raise RuntimeError(f"the sandbox exited: {child.output()[-2000:]}")
        try:
            return httpx.get(f"{url}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, 20, "the sandbox")
    except BaseException:
        child.stop()
        raise
    return child, url


def add_worker_sizing(parser: argparse.ArgumentParser) -> None:
    """--pool, --concurrency and --send-threads of the bulk workers, one meaning in every
    benchmark that starts them (the commands put --send-threads in the workers' environment)."""
    parser.add_argument("--pool", default="threads", choices=["threads", "prefork", "solo"])
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="task threads (or processes) per worker process, each taking one batch of "
        "calls at a time",
    )
    parser.add_argument(
        "--send-threads",
        type=int,
        default=2,
        help="the workers' DISPATCH_SEND_THREADS: a batch's requests in flight at once, per "
        "worker process (the product's default: 16). The sandbox answers in about a "
        "millisecond: 2 carry the bulk rate, and more only wait for the cores, in the "
        "workers and in the sandbox (docs/performance.md, the eleventh round)",
    )


def start_worker(
    root: Path,
    env: dict[str, str],
    log_dir: Path,
    index: int,
    pool: str,
    concurrency: int,
    app: str = "config",
    prefix: str = "bench",
    queues: str = "",
    nice: int = 0,
) -> Child:
    """`queues`: `-Q` for a worker that takes only some queues (every queue when empty);
    `nice`: its WORKER_NICE (config/celery_app.py), as the Procfile sets it."""
    name = f"{prefix}{index}"
    argv = [sys.executable, "-m", "celery", "-A", app, "worker"]
    argv += ["--pool", pool, "--concurrency", str(concurrency), "-n", f"{name}@%h"]
    argv += ["-Q", queues] if queues else []
    argv += ["--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"]
    env = {**env, "WORKER_NICE": str(nice)}
    return Child(name, argv, env, root, log_dir / f"{name}.log").start()


PING = """
import sys, time
from celery import Celery
names, deadline = set(sys.argv[1:]), time.monotonic() + 60
app, answered = Celery("bench-control"), set()
while time.monotonic() < deadline and not names <= answered:
    for reply in app.control.ping(timeout=0.5):
        answered.update(reply)
sys.exit(0 if names <= answered else 1)
"""


def wait_ready(workers: list[Child], env: dict[str, str], timeout: float = 60) -> None:
    """Every worker answers a control ping (they log at WARNING, so there is no "ready." line
    to wait for). The ping runs in a child process with the workers' environment: Celery
    prefers $CELERY_BROKER_URL over any broker given in code, and ours names the dev broker."""
    names = [f"{w.name}@{socket.gethostname()}" for w in workers]
    ping = subprocess.Popen([sys.executable, "-c", PING, *names], env=env)
    deadline = time.monotonic() + timeout
    try:
        while ping.poll() is None:
            for worker in workers:
                if not worker.alive():
                    raise RuntimeError(f"{worker.name} exited: {worker.output()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Celery workers did not answer a ping in {timeout} s")
            time.sleep(0.2)
        if ping.returncode:
            raise TimeoutError("the Celery workers did not answer a ping in 60 s")
    finally:
        if ping.poll() is None:
            ping.kill()
            ping.wait()


# --- memory ----------------------------------------------------------------------------------


def _children_of() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: parse after the last ")".
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def process_tree(pid: int) -> list[int]:
    tree, pids, todo = _children_of(), [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        todo.extend(tree.get(current, []))
    return pids


def _kib(path: str, field: str) -> int:
    try:
        with open(path) as handle:
            for line in handle:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_memory(pid: int) -> tuple[int, int, int]:
    """(RSS sum, PSS sum, process count) of a process and its descendants, in KiB."""
    pids = process_tree(pid)
    rss = sum(_kib(f"/proc/{p}/status", "VmRSS:") for p in pids)
    pss = sum(_kib(f"/proc/{p}/smaps_rollup", "Pss:") for p in pids)
    return rss, pss, len(pids)


class MemorySampler(threading.Thread):
    """Peak memory of each worker's process tree, sampled every `interval` seconds."""

    def __init__(self, workers: list[Child], interval: float = 0.5) -> None:
        super().__init__(name="memory-sampler", daemon=True)
        self.workers, self.interval = workers, interval
        self.peak = {w.name: {"rss_kib": 0, "pss_kib": 0, "processes": 0} for w in workers}
        self.samples = 0
        self._halt = threading.Event()

    def sample(self) -> None:
        for worker in self.workers:
            if not worker.alive():
                continue
            rss, pss, count = tree_memory(worker.pid)
            peak = self.peak[worker.name]
            if rss > peak["rss_kib"]:
                peak["rss_kib"], peak["processes"] = rss, count
            peak["pss_kib"] = max(peak["pss_kib"], pss)
        self.samples += 1

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)


# --- CPU -------------------------------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[str, int, float, float] | None:
    """(command, parent, own CPU seconds, CPU seconds of waited-for children)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    own = (int(fields[11]) + int(fields[12])) / TICK
    children = (int(fields[13]) + int(fields[14])) / TICK
    return comm, int(fields[1]), own, children


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process tree so far, children already reaped included."""
    total = 0.0
    for index, member in enumerate(process_tree(pid)):
        stat = _stat(member)
        if stat:
            total += stat[2] + (stat[3] if index == 0 else 0.0)
    return total


def server_cpu(command: str) -> float:
    """CPU seconds of a server started outside (postgres, redis-server): its root processes
    with the backends they reaped, plus the live ones. Other clients' work counts too."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat and stat[0].startswith(command):
                stats[int(entry)] = stat
    return sum(
        own + (reaped if parent not in stats else 0.0) for _, parent, own, reaped in stats.values()
    )


def system_busy() -> float:
    """Busy CPU seconds of the whole machine (all cores)."""
    with open("/proc/stat") as handle:
        fields = [int(x) for x in handle.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / TICK


def cpu_snapshot(workers: list[Child], sandbox: Child) -> dict[str, float]:
    snapshot = {w.name: tree_cpu(w.pid) for w in workers if w.alive()}
    snapshot["sandbox"] = tree_cpu(sandbox.pid) if sandbox.alive() else 0.0
    snapshot["postgres"] = server_cpu("postgres")
    snapshot["redis"] = server_cpu("redis-server")
    snapshot["machine"] = system_busy()
    return snapshot
