"""The backend that signs people in to the console: Django's, reading the person with their
tenant, and the middleware that lets it take the person the session's read loaded.

Every console page names the person's tenant (the request's log context, each view's
filters, the top bar): with the tenant joined to the person's row it is one query per
request fewer, on every page (one hand-written statement: runs/sql.py, person_read). And the
session's own read loads that person too (runs/sessions.py): one more query fewer. A session
signed in through Django's own ModelBackend (before this backend) must sign in once again.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from django.contrib import auth
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.middleware import AuthenticationMiddleware as DjangoMiddleware
from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from runs import sql
from runs.models import User
from runs.sessions import NOT_READ

# The session of the request whose person Django is reading, while it reads them: Django's
# `get_user` hands a backend only the id.
_session: ContextVar[Any] = ContextVar("countersign_session", default=None)


class PersonBackend(ModelBackend):
    def get_user(self, user_id: Any) -> User | None:
        session = _session.get()
        user = NOT_READ if session is None else session.person(user_id)
        if user is NOT_READ:
            # Written out (runs/sql.py): the ORM's compilation of this read was most of its cost.
            user = sql.person_read(user_id)
        return user if user is not None and self.user_can_authenticate(user) else None


class AuthenticationMiddleware(DjangoMiddleware):
    """Django's, with `request.user` read while the request's session is known to the
    backend. Everything else (which backend, the session hash, `request.auser`) is Django's."""

    def process_request(self, request: HttpRequest) -> None:
        super().process_request(request)
        request.user = SimpleLazyObject(lambda: _user(request))


def _user(request: HttpRequest) -> Any:
    # Cached where Django's middleware caches it.
    if not hasattr(request, "_cached_user"):
        token = _session.set(request.session)
        try:
            request._cached_user = auth.get_user(request)
        finally:
            _session.reset(token)
    return request._cached_user
