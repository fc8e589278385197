"""The test suite: base settings on PostgreSQL and Redis, fast hashing, mail kept in memory."""

from __future__ import annotations

import copy
import os

from config.settings.base import *  # noqa: F403
from config.settings.base import DATABASE_SESSION_LIMITS, DATABASES, postgres_session_options

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
