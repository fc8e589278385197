"""Crash points for the fault tests: a process dies exactly here, once.

Off unless COUNTERSIGN_CRASH_AT is set (never in production). Its value is
`<point>:<marker file>`; the first process to reach that point creates the marker and kills
itself with SIGKILL, as an OOM kill or a pulled plug would; later ones pass.
"""

from __future__ import annotations

import os
import signal


def crashpoint(point: str) -> None:
    setting = os.environ.get("COUNTERSIGN_CRASH_AT")
    if not setting:
        return
    wanted, _, marker = setting.partition(":")
    if wanted != point or not marker:
        return
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)
