"""OpenTelemetry tracing: on when OTEL_EXPORTER_OTLP_ENDPOINT is set, entirely off otherwise.

Off, nothing of OpenTelemetry is imported and every function here returns at once. On, each
process (web: config/wsgi.py; worker and beat: config/celery_app.py) sends its spans over
OTLP/HTTP to the endpoint, and the maintained instrumentations make them: Django (the API
request), Celery (publishing a task, running it), httpx (calls to external systems) and
psycopg (every SQL statement). The ids of runs/logcontext.py become attributes of every span.

The trace crosses the outbox: a message stores the W3C `traceparent` of the span current when
it was written, and is published inside a span that continues that trace, whenever and wherever
it is published (after the API's commit, or by the sweeper in another process minutes later).
Celery's instrumentation carries that context in the message headers to the worker.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from runs import logcontext

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from runs.models import OutboxMessage

_tracer: Any = None  # an opentelemetry Tracer while tracing is on


def enabled() -> bool:
    return _tracer is not None


def configure(service: str) -> bool:
    """Trace this process if OTEL_EXPORTER_OTLP_ENDPOINT is set (and OTEL_SDK_DISABLED is
    not); `service` names it (`web`, `worker`, `beat`) unless OTEL_SERVICE_NAME does.
    Returns whether tracing is on. Safe to call twice."""
    if enabled():
        return True
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    if not endpoint or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME") or f"countersign-{service}"
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    # The exporter reads the endpoint, headers, timeout and compression from OTEL_EXPORTER_*.
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    instrument(provider)
    return True


def instrument(provider: TracerProvider) -> None:
    """Instrument Django, Celery, httpx and psycopg with `provider` (configure's, or a test's
    in-memory one). Django's must come before the first request loads the middleware."""
    global _tracer
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    from config.celery_app import app

    provider.add_span_processor(_ids_span_processor())
    DjangoInstrumentor().instrument(tracer_provider=provider)
    CeleryInstrumentor().instrument(tracer_provider=provider)
    HTTPXClientInstrumentor().instrument(tracer_provider=provider)
    PsycopgInstrumentor().instrument(tracer_provider=provider)
    # Celery's instrumentation only ends a publish span for a task it knows by name; the web
    # publishes by name (send_task) without importing the tasks, so import them here.
    app.autodiscover_tasks(force=True)
    _tracer = provider.get_tracer("countersign")
    logcontext.span_hook = _set_on_current_span


def uninstrument() -> None:
    """Undo `instrument` (tests)."""
    global _tracer
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    for instrumentor in (
        DjangoInstrumentor,
        CeleryInstrumentor,
        HTTPXClientInstrumentor,
        PsycopgInstrumentor,
    ):
        instrumentor().uninstrument()
    _tracer = None
    logcontext.span_hook = None


def _set_on_current_span(ids: dict[str, str]) -> None:
    from opentelemetry import trace

    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(ids)


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span, to store with an outbox message."""
    if not enabled():
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")


def publishing(message: OutboxMessage) -> contextlib.AbstractContextManager[Any]:
    """The span of publishing an outbox message: a child of the span that wrote it (its
    stored traceparent), so Celery's publish span and the task's spans join that trace."""
    if not enabled():
        return contextlib.nullcontext()
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = None
    if message.traceparent:
        parent = TraceContextTextMapPropagator().extract({"traceparent": message.traceparent})
    return _tracer.start_as_current_span(
        "outbox publish",
        context=parent,
        kind=SpanKind.PRODUCER,
        attributes={"outbox.message_id": message.pk, "outbox.task": message.task},
    )


@contextlib.contextmanager
def outside_any_trace() -> Iterator[None]:
    """Run the block in no trace: a drainer's wake-up serves every row committed before its
    drainer starts, not the request that happened to publish it, so the drain task and its
    leases start a trace of their own (each row's handling joins the row's trace: `draining`)."""
    if not enabled():
        yield
        return
    from opentelemetry import context

    token = context.attach(context.Context())
    try:
        yield
    finally:
        context.detach(token)


def draining(task: str, traceparents: list[str | None]) -> contextlib.AbstractContextManager[Any]:
    """The span of a drainer handing a batch of outbox rows to their task's handler
    (runs/drain.py). A batch of one continues the trace of the span that wrote the row, as a
    published task does; a larger batch starts its own trace, linked to each row's."""
    if not enabled():
        return contextlib.nullcontext()
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    contexts = [
        trace.get_current_span(TraceContextTextMapPropagator().extract({"traceparent": tp}))
        .get_span_context()
        for tp in traceparents
        if tp
    ]
    parent = None
    if len(traceparents) == 1 and traceparents[0]:
        parent = TraceContextTextMapPropagator().extract({"traceparent": traceparents[0]})
    return _tracer.start_as_current_span(
        f"drain/{task}",
        context=parent,
        kind=SpanKind.CONSUMER,
        links=[Link(context) for context in contexts] if parent is None else None,
        attributes={"outbox.task": task, "outbox.batch_size": len(traceparents)},
    )


def current_trace_ids() -> dict[str, str]:
    """trace_id and span_id of the current span, for a log line; empty when off or none."""
    if not enabled():
        return {}
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


def _ids_span_processor() -> Any:
    from opentelemetry.sdk.trace import SpanProcessor

    class IdsSpanProcessor(SpanProcessor):
        """Puts the ids bound when a span starts on it (an SQL statement, an HTTP call, a
        task); ids bound later go on the span current then (`_set_on_current_span`)."""

        def on_start(self, span: Any, parent_context: Any = None) -> None:
            if ids := logcontext.bound():
                span.set_attributes(ids)

    return IdsSpanProcessor()
