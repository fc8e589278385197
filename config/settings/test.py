"""The test suite: base settings on PostgreSQL and Redis, fast hashing, mail kept in memory."""

from __future__ import annotations

import copy
import os

from config.settings.base import *  # noqa: F403
from config.settings.base import (
    CELERY_BROKER_URL,
    DATABASE_SESSION_LIMITS,
    DATABASES,
    postgres_session_options,
)

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
# Teardown of transactional tests flushes every table, the event log included.
EVENT_LOG_ALLOW_FLUSH = True

# pytest-django runs each `db` test inside one transaction, which sits idle while the test
# waits on anything else (the sandbox, a thread, a worker process): the server must not end
# it. Off unless the environment sets it, so a worker process a test starts can have it.
_BASE_SESSION = postgres_session_options(DATABASE_SESSION_LIMITS)
DATABASE_SESSION_LIMITS = {
    **DATABASE_SESSION_LIMITS,
    "idle_in_transaction_session_timeout": os.environ.get(
        "DATABASE_IDLE_IN_TRANSACTION_TIMEOUT", "0"
    ),
}
DATABASES = copy.deepcopy(DATABASES)  # base.py's own dict stays as production has it
_options = DATABASES["default"].get("OPTIONS", {})
if _BASE_SESSION and "options" in _options:
    _options["options"] = _options["options"].replace(
        _BASE_SESSION, postgres_session_options(DATABASE_SESSION_LIMITS)
    )

# bin/test runs the suite in pytest-xdist processes gw0, gw1 …: pytest-django gives each a
# database of its own (test_countersign_gw1 …), and this gives each a Redis database of its
# own, the named one plus N. Written back to the environment, which the worker and beat
# processes that a test starts (and the benchmark commands) inherit; the process's name is
# taken out of it, so that those processes, loading these settings too, do not move it again.
_xdist_worker = os.environ.pop("PYTEST_XDIST_WORKER", "")
if _xdist_worker and CELERY_BROKER_URL.startswith("redis"):
    _server, _, _named = CELERY_BROKER_URL.rpartition("/")
    _db = int(_named or 0) + int(_xdist_worker.removeprefix("gw"))
    if _db > 15:
        raise ValueError(
            f"CELERY_BROKER_URL: pytest-xdist process {_xdist_worker} would use Redis database"
            f" {_db}, past the server's 16 (0-15): name a lower one"
        )
    CELERY_BROKER_URL = f"{_server}/{_db}"
    os.environ["CELERY_BROKER_URL"] = CELERY_BROKER_URL
