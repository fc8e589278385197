"""The test suite: base settings on PostgreSQL and Redis, fast hashing, mail kept in memory."""

from __future__ import annotations

from config.settings.base import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
# Teardown of transactional tests flushes every table, the event log included.
EVENT_LOG_ALLOW_FLUSH = True
