"""Long-lived processes move what they loaded at start out of the garbage collector's way.

A full (generation 2) collection walks every container object the process holds. A web
process holds about 150,000 once Django is set up (modules, classes, URL patterns, field and
validator instances): a full collection then takes 30-40 ms, and in `bench_approve`'s clicking
process (which also holds Celery and the benchmark) one took 92 ms in the middle of an
approve POST — the one click of 60 over 50 ms (seen with `gc.callbacks`). `gc.freeze()` moves
the objects alive at that moment into a permanent generation that collections skip; what
requests and tasks allocate later is collected as before. (Instagram's reason for it was
copy-on-write after fork; ours is the pause.)

Called once a process has loaded what it serves: config/wsgi.py after the handler is built,
a Celery worker when it is ready (and each forked pool child, for the prefork pool)."""

from __future__ import annotations

import gc


def freeze() -> int:
    """Collect what startup left as garbage, then freeze the rest. Returns how many objects
    are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
