"""Fault points for the fault tests: a process dies, or stops, exactly here, once.

Off unless one of these is set (never in production), each to `<point>:<marker file>`; the
first process to reach that point creates the marker and then
- COUNTERSIGN_CRASH_AT: kills itself with SIGKILL, as an OOM kill or a pulled plug would;
- COUNTERSIGN_PAUSE_AT: stops itself with SIGSTOP, as a stalled VM or a debugger would, holding
  whatever it holds (an open transaction, its row locks) until someone sends SIGCONT.
Later processes pass.
"""

from __future__ import annotations

import os
import signal

SIGNALS = {"COUNTERSIGN_CRASH_AT": signal.SIGKILL, "COUNTERSIGN_PAUSE_AT": signal.SIGSTOP}


def crashpoint(point: str) -> None:
    for variable, sig in SIGNALS.items():
        setting = os.environ.get(variable)
        if not setting:
            continue
        wanted, _, marker = setting.partition(":")
        if wanted != point or not marker:
            continue
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        os.kill(os.getpid(), sig)
