"""Production: PostgreSQL, Redis, HTTPS. Everything else comes from base.py."""

from __future__ import annotations

from config.settings.base import *  # noqa: F403
from config.settings.base import env_bool

DEBUG = False
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
# The proxy in front of the WSGI server terminates TLS and says so in this header.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_HSTS_SECONDS = 60 * 60 * 24 * 365
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SESSION_COOKIE_SECURE = True
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_SECURE = True
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# Static files are collected at release time; no finders on a hot path.
WHITENOISE_USE_FINDERS = False
