"""CPU time of the PostgreSQL backends that serve one database, read from /proc.

PostgreSQL runs one process per connection. The server's own counters do not say how much CPU
a database cost, and the postmaster's reaped-children total mixes every database on the
server, so the benchmark watches the backends themselves: `pg_stat_activity` names the pids
connected to its database (read from the `postgres` database, so the watching costs the
measured database nothing), and /proc/<pid>/stat says how much CPU each has used. A backend
that exits between two samples loses at most one interval of its CPU; the project's
connections persist (CONN_MAX_AGE), so that is rare. No Django here: the DBOS baseline imports
it too.
"""

from __future__ import annotations

import threading
import time

import psycopg

from bench import pgstats
from bench.procs import TICK


def _cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class BackendCpu(threading.Thread):
    """CPU seconds the backends of database `name` used between start() and stop()."""

    def __init__(self, url: str, name: str, interval: float = 0.1, rescan: float = 0.5) -> None:
        super().__init__(name=f"backend-cpu-{name}", daemon=True)
        self.url, self.database = url, name
        self.interval, self.rescan = interval, rescan
        self.start_cpu: dict[int, float] = {}  # pids already there at the start: their CPU then
        self.last_cpu: dict[int, float] = {}
        self.backends_seen = 0
        self._halt = threading.Event()
        self._conn = psycopg.connect(pgstats.admin_conninfo(url), autocommit=True)
        for pid in self._pids():
            cpu = _cpu_seconds(pid)
            if cpu is not None:
                self.start_cpu[pid] = self.last_cpu[pid] = cpu

    def _pids(self) -> list[int]:
        rows = self._conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", [self.database]
        ).fetchall()
        return [row[0] for row in rows]

    def _sample(self, pids: list[int]) -> None:
        for pid in pids:
            cpu = _cpu_seconds(pid)
            if cpu is not None:
                self.last_cpu[pid] = cpu

    def run(self) -> None:
        next_scan = 0.0
        while not self._halt.is_set():
            if time.monotonic() >= next_scan:
                for pid in self._pids():
                    self.last_cpu.setdefault(pid, 0.0)
                next_scan = time.monotonic() + self.rescan
            self._sample(list(self.last_cpu))
            self._halt.wait(self.interval)

    def stop(self) -> float:
        """Stop watching; the CPU seconds used since the start."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)
        self._sample(self._pids())
        self._conn.close()
        self.backends_seen = len(self.last_cpu)
        return sum(cpu - self.start_cpu.get(pid, 0.0) for pid, cpu in self.last_cpu.items())
