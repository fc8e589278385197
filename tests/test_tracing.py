"""OpenTelemetry: one proposal is one trace, from the API request through the outbox and the
broker to the worker's task, its HTTP calls and its SQL (config/telemetry.py).

The test process traces into memory; a worker process exports over OTLP/HTTP to a small
collector the test runs, which decodes the protobuf the SDK's exporter sends."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings
from django.db import transaction
from django.utils import timezone
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from config import telemetry
from runs import outbox
from runs.models import OutboxMessage
from tests.celery_processes import flush_broker
from tests.helpers import ROOT, fresh, propose, tool_call_of, wait_for

# --- the two ends: spans in memory here, spans over OTLP from a worker ---------------------


@pytest.fixture
def spans(settings: Any) -> Iterator[InMemorySpanExporter]:
    """This process traces into memory. Django's instrumentation adds its middleware to the
    settings; the `settings` fixture puts them back."""
    settings.MIDDLEWARE = list(settings.MIDDLEWARE)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.instrument(provider)
    yield exporter
    telemetry.uninstrument()
    provider.shutdown()


class Collector:
    """An OTLP/HTTP endpoint on 127.0.0.1 that keeps every span it receives, flattened."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                collector.receive(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def receive(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        {
                            "service": resource.get("service.name"),
                            "name": span.name,
                            "kind": span.kind,
                            "trace_id": span.trace_id.hex(),
                            "attributes": {
                                a.key: a.value.string_value or a.value.int_value
                                for a in span.attributes
                            },
                        }
                    )

    def named(self, name: str) -> list[dict[str, Any]]:
        return [span for span in self.spans if span["name"] == name]


@pytest.fixture
def collector() -> Iterator[Collector]:
    collector = Collector()
    yield collector
    collector.server.shutdown()


def trace_id(span: ReadableSpan) -> str:
    return f"{span.context.trace_id:032x}"


def request_span(spans: InMemorySpanExporter, tool_call_id: str) -> ReadableSpan:
    """The API request that proposed the call (the instrumentation's server span)."""
    [span] = [
        span
        for span in spans.get_finished_spans()
        if span.kind == SpanKind.SERVER and span.attributes.get("tool_call_id") == tool_call_id
    ]
    return span


# --- tests ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_one_proposal_is_one_trace_from_the_api_to_the_worker(
    agent, sandbox, start_celery, spans, collector
) -> None:
    start_celery("worker", OTEL_EXPORTER_OTLP_ENDPOINT=collector.url, OTEL_BSP_SCHEDULE_DELAY="100")
    call = tool_call_of(propose(agent))
    wait_for(
        lambda: fresh(call).verification_status == "confirmed_success", 40, "the call to settle"
    )
    request = request_span(spans, call.pk)
    # The outbox drainer dispatched it (runs/drain.py); a batch of one continues the trace of
    # the request that wrote its outbox row.
    wait_for(lambda: collector.named("drain/toolcalls.dispatch"), 20, "the worker's spans")

    [dispatch] = collector.named("drain/toolcalls.dispatch")
    assert dispatch["service"] == "countersign-worker"
    assert dispatch["trace_id"] == trace_id(request)
    assert dispatch["attributes"]["tool_call_id"] == call.pk
    assert dispatch["attributes"]["run_id"] == call.run_id
    assert dispatch["attributes"]["tenant"] == "acme"
    # Under the dispatch, in the same trace and naming the call: the HTTP request to the
    # external system, and SQL statements.
    in_trace = [span for span in collector.spans if span["trace_id"] == trace_id(request)]
    http = [s for s in in_trace if s["attributes"].get("http.url", "").startswith(sandbox.url)]
    sql = [s for s in in_trace if s["attributes"].get("db.system") == "postgresql"]
    assert http and all(s["attributes"]["tool_call_id"] == call.pk for s in http)
    assert sql and all(s["attributes"]["tool_call_id"] == call.pk for s in sql)
    # And on the web's side, the commit published one wake-up of the drainer, in a trace of
    # its own (it serves every row committed before its drainer starts, not this request),
    # and no message of the call's own.
    finished = spans.get_finished_spans()
    [woken] = [s for s in finished if s.name == "apply_async/runs.drain_outbox"]
    assert trace_id(woken) != trace_id(request)
    assert not [s for s in finished if s.name == "outbox publish"]


@pytest.mark.django_db
def test_a_message_published_later_by_the_sweeper_continues_the_proposal_trace(
    agent, sandbox, spans, settings
) -> None:
    flush_broker()
    # In a `db` test the commit never happens, so the publish after it never either: the
    # message waits for the sweeper, as after a broker outage.
    call = propose(agent)
    request = request_span(spans, call["tool_call_id"])
    message = OutboxMessage.objects.get(task="toolcalls.dispatch")
    assert message.traceparent.split("-")[1] == trace_id(request)

    settings.OUTBOX_REPUBLISH_AFTER_SECONDS = 0
    OutboxMessage.objects.update(available_at=timezone.now() - timedelta(minutes=5))
    spans.clear()
    assert outbox.republish_due() == 1  # outside any request or span

    finished = spans.get_finished_spans()
    [publish] = [s for s in finished if s.name == "apply_async/toolcalls.dispatch"]
    assert trace_id(publish) == trace_id(request)
    # The context the worker will continue travels in the message's headers.
    [raw] = redis.Redis.from_url(django_settings.CELERY_BROKER_URL).lrange("celery", 0, -1)
    headers = json.loads(raw)["headers"]
    assert headers["traceparent"].split("-")[1] == trace_id(request)
    flush_broker()


@pytest.mark.django_db
def test_without_tracing_an_outbox_message_has_no_traceparent() -> None:
    with transaction.atomic():
        message = outbox.enqueue("toolcalls.dispatch", "tc_x", publish_now=False)
    assert message.traceparent is None


def web_process_state(**env: str) -> list[str]:
    """What a web process that loaded config/wsgi.py has: OpenTelemetry modules, middleware
    and whether it knows the dispatch task by name."""
    script = (
        "import sys, config.wsgi; from django.conf import settings; "
        "from config.celery_app import app; "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.instrumentation.'))); "
        "print(settings.MIDDLEWARE[0]); print('toolcalls.dispatch' in app.tasks)"
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**environment, **env},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_without_an_endpoint_nothing_of_opentelemetry_is_loaded() -> None:
    modules, first_middleware, knows_tasks = web_process_state()
    assert modules == "[]"
    assert first_middleware == "runs.logcontext.LogContextMiddleware"
    assert knows_tasks == "False"


def test_with_an_endpoint_the_web_process_is_instrumented() -> None:
    # Nothing listens there: spans that cannot be sent are dropped, the process goes on.
    modules, first_middleware, knows_tasks = web_process_state(
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9"
    )
    for name in ("celery", "django", "httpx", "psycopg"):
        assert f"opentelemetry.instrumentation.{name}'" in modules
    assert first_middleware.startswith("opentelemetry.instrumentation.django")
    # Celery's instrumentation ends a publish span only for a task it knows.
    assert knows_tasks == "True"
