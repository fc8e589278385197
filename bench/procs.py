"""Child processes of the benchmark: the sandbox, Celery workers, and their memory."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
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
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        # Pool children that outlived their parent go too: the group is ours alone.
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def start_sandbox(root: Path, env: dict[str, str], data_dir: Path, log_dir: Path) -> tuple:
    port = free_port()
    argv = [sys.executable, "-m", "toolcalls.sandbox", "--port", str(port)]
    argv += ["--data-dir", str(data_dir), "--quiet"]
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


def start_worker(
    root: Path, env: dict[str, str], log_dir: Path, index: int, pool: str, concurrency: int
) -> Child:
    name = f"bench{index}"
    argv = [sys.executable, "-m", "celery", "-A", "config", "worker"]
    argv += ["--pool", pool, "--concurrency", str(concurrency), "-n", f"{name}@%h"]
    argv += ["--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"]
    return Child(name, argv, env, root, log_dir / f"{name}.log").start()


def wait_ready(workers: list[Child], timeout: float = 60) -> None:
    def ready() -> bool:
        for worker in workers:
            if not worker.alive():
                raise RuntimeError(f"{worker.name} exited: {worker.output()[-3000:]}")
        return all(" ready." in worker.output() for worker in workers)

    wait_for(ready, timeout, "the Celery workers")


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
