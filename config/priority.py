"""Lower a process's CPU priority, so that on saturated cores the work a person waits for (the
console's web process, the `interactive` worker) is scheduled before bulk work (the bulk
Celery workers: WORKER_NICE; the agents' API process: WEB_NICE, both in the Procfile).
Imports nothing of Django: gunicorn's config file (config/gunicorn.py) calls it too."""

from __future__ import annotations

import os


def lower(nice: int) -> None:
    """os.nice(nice) for this process (inherited by the threads and children it starts), and
    the same for its session group where it leads one. A non-positive `nice` changes nothing."""
    if nice <= 0:
        return
    os.nice(nice)
    _lower_the_session_group(nice)


def _lower_the_session_group(nice: int) -> None:
    """With Linux's autogroup scheduling a thread's nice value only ranks it against the
    threads of its own session: each session is one group, and groups share the cores
    equally. A process started in a session of its own (setsid, a supervisor that starts each
    program in a new session; the benchmarks and the tests do) is alone in its group, so
    os.nice alone changed nothing against the web process, the `interactive` worker or
    PostgreSQL's backends (bench_approve --load dispatch). The group's own nice value is what
    ranks it; set only by a session's leader, which would otherwise lower its whole terminal's
    session, the web process perhaps included. Under systemd or in a container, cgroups rank
    the services and this file changes nothing."""
    if os.getsid(0) != os.getpid():
        return
    try:
        with open("/proc/self/autogroup", "w") as autogroup:
            autogroup.write(str(nice))
    except OSError:
        pass  # no autogroup (not Linux, or CONFIG_SCHED_AUTOGROUP off): nothing to rank
