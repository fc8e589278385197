"""The ids of what a request or a task is working on, for its log lines and trace spans.

Each web request (`LogContextMiddleware`) and each Celery task (`config/celery_app.py`) starts
with none and binds them as they become known: the tenant of the API key or the person, the
run, call or approval its URL names, the task's arguments, the call it loaded and locked
(`toolcalls.writes.tool_call_lock`). `config/logs.py` writes them into every log line; when
tracing is on, `config/telemetry.py` sets `span_hook` so they also become attributes of the
current span.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from django.core.signals import request_finished
from django.http import HttpRequest, HttpResponse

# The names, in log lines and span attributes alike.
IDS = ("tenant", "run_id", "tool_call_id", "approval_id", "correlation_id")
# URL parameters that name one of them (API and console).
URL_IDS = ("run_id", "tool_call_id", "approval_id")

_bound: ContextVar[dict[str, str] | None] = ContextVar("countersign_ids", default=None)
# Called with the ids just bound; set by config.telemetry only when tracing is on.
span_hook: Callable[[dict[str, str]], None] | None = None


def bind(
    *,
    tenant: str | None = None,
    run_id: str | None = None,
    tool_call_id: str | None = None,
    approval_id: str | None = None,
    correlation_id: str | None = None,
) -> None:
    """Add the ids given (empty ones are ignored) to the current request's or task's."""
    given = {
        "tenant": tenant,
        "run_id": run_id,
        "tool_call_id": tool_call_id,
        "approval_id": approval_id,
        "correlation_id": correlation_id,
    }
    new = {name: str(value) for name, value in given.items() if value}
    if not new:
        return
    _bound.set({**(_bound.get() or {}), **new})
    if span_hook is not None:
        span_hook(new)


def bound() -> dict[str, str]:
    return _bound.get() or {}


def start(**ids: str) -> None:
    """A new request or task: forget the previous one's ids, bind these."""
    _bound.set(None)
    bind(**{name: value for name, value in ids.items() if name in IDS})


def _forget(**kwargs: Any) -> None:
    start()


class LogContextMiddleware:
    """Each request starts with no ids, then binds its URL's and its person's tenant. They stay
    bound until the response is closed, so Django's own line about a 4xx or 5xx (logged after
    the middleware) names them too."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        request_finished.connect(_forget, dispatch_uid="countersign-logcontext")

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # A WSGI thread serves request after request in one context: start from none.
        start()
        return self.get_response(request)

    def process_view(
        self, request: HttpRequest, view: Any, args: Any, kwargs: dict[str, Any]
    ) -> None:
        user = getattr(request, "user", None)
        # An API request has no session: no query here. A console page reads the person anyway.
        tenant = user.tenant if user is not None and user.is_authenticated else None
        bind(
            tenant=tenant.slug if tenant else None,
            **{name: str(kwargs[name]) for name in URL_IDS if kwargs.get(name)},
        )
