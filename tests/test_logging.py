"""Log lines are one JSON object each, naming the tenant, run, call, approval and correlation
ids the request or task knows (config/logs.py, runs/logcontext.py)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from runs import logcontext
from tests.helpers import ApiClient, fresh, propose, tool_call_of, wait_for


@pytest.fixture
def log_lines() -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """What the configured console handler writes from now on, each line parsed as JSON."""
    handler = next(h for h in logging.getLogger().handlers if h.get_name() == "console")
    written = io.StringIO()
    previous = handler.setStream(written)
    logcontext.start()
    yield lambda: [json.loads(line) for line in written.getvalue().splitlines()]
    handler.setStream(previous)
    logcontext.start()


def test_a_log_line_is_one_json_object_with_the_ids_bound(log_lines) -> None:
    logcontext.start(tool_call_id="tc_1", tenant="acme")
    logcontext.bind(run_id="run_1", correlation_id="order-001", approval_id="apr_1")
    try:
        raise ValueError("the sandbox said no")
    except ValueError:
        logging.getLogger("toolcalls.dispatch").exception("dispatch of %s failed", "tc_1")

    [line] = log_lines()
    assert line["level"] == "ERROR"
    assert line["logger"] == "toolcalls.dispatch"
    assert line["message"] == "dispatch of tc_1 failed"
    assert line["timestamp"].endswith("+00:00")
    assert "ValueError: the sandbox said no" in line["exception"]
    ids = {name: line[name] for name in logcontext.IDS}
    assert ids == {
        "tenant": "acme",
        "run_id": "run_1",
        "tool_call_id": "tc_1",
        "approval_id": "apr_1",
        "correlation_id": "order-001",
    }


def test_an_api_request_logs_with_the_tenant_and_the_call_it_names(agent: ApiClient, log_lines):
    response = agent.get("/api/v1/tool-calls/tc_nosuchcall")
    assert response.status_code == 404

    # Django's "Not Found" line is written after the middleware: the ids are still bound.
    [line] = [line for line in log_lines() if line["logger"] == "django.request"]
    assert line["level"] == "WARNING"
    assert line["tenant"] == "acme"
    assert line["tool_call_id"] == "tc_nosuchcall"
    # The request is over: the test's own context names nothing.
    assert logcontext.bound() == {}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_worker_logs_json_lines_that_name_the_call(agent, sandbox, start_celery) -> None:
    worker = start_celery("worker")
    call = tool_call_of(propose(agent))
    wait_for(
        lambda: fresh(call).verification_status == "confirmed_success", 40, "the call to settle"
    )

    logged = [json.loads(line) for line in worker.output().splitlines() if line.startswith("{")]
    about_the_call = [line for line in logged if line.get("tool_call_id") == call.pk]
    succeeded = [line for line in about_the_call if "succeeded" in line["message"]]
    assert succeeded, worker.output()
    line = succeeded[0]
    assert line["logger"] == "celery.app.trace"
    assert line["tenant"] == "acme"
    assert line["run_id"] == call.run_id
    assert line["correlation_id"] == call.run.correlation_id
