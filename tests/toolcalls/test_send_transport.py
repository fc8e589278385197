"""A tool call's write goes over a kept-alive `http.client` connection (toolcalls/keepalive.py
`send`, through toolcalls/connectors.py `write`), and toolcalls/send.py's outcome rules mean
what they meant with httpx: refused = not sent, retryable; a timeout or a broken connection
after sending = unknown, never sent again by the transport; status codes as before.

The external system here is a scripted HTTP server on a real socket: each request takes the
next step of its plan and the server keeps what it received, so "sent once" is counted."""

from __future__ import annotations

import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from config import telemetry
from runs.models import Run
from tests.helpers import fresh, propose_in
from tests.sandbox_process import Sandbox
from toolcalls import capabilities, connectors, dispatch, keepalive
from toolcalls.dispatch import Claim
from toolcalls.send import Outcome, send

REFUND = {"order_id": "order-002", "amount_cents": 2500, "currency": "USD", "reason": "é"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append(
            {"port": self.client_address[1], "headers": dict(self.headers), "body": body}
        )
        step = self.server.plan.pop(0) if self.server.plan else "ok"
        if step == "reset":  # RST as soon as the request is read: no answer, no FIN
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return
        if step == "drop":  # FIN without an answer
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if step == "slow":
            time.sleep(1.0)
        status, extra, payload = _ANSWERS.get(step, (200, {}, b'{"refund_id": "re_1"}'))
        self.send_response(status)
        for name, value in {"Content-Length": str(len(payload)), **extra}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()
        if step == "ok_then_idle_close":  # as a server's idle timeout does, without saying so
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            self.server.closed.set()

    def log_message(self, format: str, *args: object) -> None:
        pass


_ANSWERS: dict[str, tuple[int, dict[str, str], bytes]] = {
    "replayed": (200, {"Idempotent-Replayed": "true"}, b'{"refund_id": "re_1"}'),
    "429": (429, {"Retry-After": "7"}, b'{"error": "rate_limited", "message": "slow down"}'),
    "503": (503, {}, b'{"error": "unavailable", "message": "later"}'),
    "500": (500, {}, b'{"error": "internal_error", "message": "oops"}'),
    "401": (401, {}, b'{"error": "unauthorized", "message": "bad key"}'),
    "400": (400, {}, b'{"error": "invalid", "message": "bad amount"}'),
    "409": (409, {}, b'{"error": "conflict", "message": "already refunded"}'),
    "html": (502, {"Content-Type": "text/html"}, b"<h1>Bad gateway</h1>"),
}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.plan: list[str] = []
        self.received: list[dict[str, Any]] = []
        self.closed = threading.Event()
        self.scheme = "http"

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a reset or a client that gave up: expected here

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server_address[1]}"


def _serve(httpd: _Server) -> Iterator[_Server]:
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def fresh_connections() -> None:
    keepalive._local.__dict__.clear()  # this thread's connections from earlier tests


@pytest.fixture
def server(settings: Any) -> Iterator[_Server]:
    httpd = _Server()
    settings.COUNTERSIGN_CONNECTORS = {"acme": {"payments": {"base_url": httpd.url, "token": "k"}}}
    settings.TOOLCALL_TIMEOUT_OVERRIDE = 0.5
    yield from _serve(httpd)


def _claim(number: int = 1) -> Claim:
    capability = capabilities.get("refund-order-v2")
    assert capability is not None
    return Claim(
        tool_call_id=f"tc_{number}",
        attempt_id=f"at_{number}",
        fencing_token=1,
        tenant_slug="acme",
        capability=capability,
        args=REFUND,
        external_request_id=f"req_{number}",
        idempotency_key=f"key_{number}",
    )


def _kinds(*outcomes: Outcome) -> list[tuple[str, str]]:
    return [(outcome.kind, outcome.error_name) for outcome in outcomes]


def test_writes_share_one_connection_and_carry_the_calls_headers(server: _Server) -> None:
    outcomes = [send(_claim(1)), send(_claim(2))]

    assert _kinds(*outcomes) == [("confirmed", ""), ("confirmed", "")]
    assert outcomes[0].body == {"refund_id": "re_1"}
    first, second = server.received
    assert first["port"] == second["port"]  # the same client socket
    headers = first["headers"]
    assert headers["Authorization"] == "Bearer k"
    assert (headers["Idempotency-Key"], headers["X-Request-Id"]) == ("key_1", "req_1")
    assert headers["Content-Type"] == "application/json"
    # The bytes httpx sends for json=: a retry under the same key sends the same body.
    assert first["body"] == httpx.Request("POST", server.url, json=REFUND).content


def test_a_connection_the_server_closed_while_idle_is_not_used_and_the_write_goes_once(
    server: _Server,
) -> None:
    server.plan = ["ok_then_idle_close"]
    first = send(_claim(1))
    assert server.closed.wait(2)

    second = send(_claim(2))

    assert _kinds(first, second) == [("confirmed", ""), ("confirmed", "")]
    assert [r["headers"]["Idempotency-Key"] for r in server.received] == ["key_1", "key_2"]
    assert server.received[0]["port"] != server.received[1]["port"]


def test_a_connection_idle_too_long_is_not_reused(server: _Server, monkeypatch) -> None:
    monkeypatch.setattr(keepalive, "IDLE_EXPIRY", 0.0)
    send(_claim(1))
    send(_claim(2))

    assert server.received[0]["port"] != server.received[1]["port"]


@pytest.mark.parametrize("fault", ["reset", "drop"])
def test_a_connection_broken_after_the_request_is_unknown_and_not_sent_again(
    server: _Server, fault: str
) -> None:
    # On a reused connection, where a transport that retries stale connections would resend.
    server.plan = ["ok", fault]
    send(_claim(1))

    outcome = send(_claim(2))

    assert _kinds(outcome) == [("unknown", "tool.connection_lost")]
    assert [r["headers"]["Idempotency-Key"] for r in server.received] == ["key_1", "key_2"]
    assert _kinds(send(_claim(3))) == [("confirmed", "")]  # on a new connection


def test_no_answer_in_time_is_unknown(server: _Server) -> None:
    server.plan = ["slow"]

    assert _kinds(send(_claim(1))) == [("unknown", "tool.timeout")]
    assert len(server.received) == 1


def test_a_host_that_refuses_is_retryable_and_nothing_was_sent(settings: Any) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # nothing listens on it
    url = f"http://127.0.0.1:{port}"
    settings.COUNTERSIGN_CONNECTORS = {"acme": {"payments": {"base_url": url, "token": "k"}}}

    outcome = send(_claim(1))

    assert _kinds(outcome) == [("retryable", "tool.unreachable")]
    assert "ConnectionRefusedError" in outcome.message


@pytest.mark.parametrize(
    ("step", "kind", "error_name", "retry_after"),
    [
        ("replayed", "confirmed", "", None),
        ("429", "retryable", "tool.rate_limited", 7.0),
        ("503", "retryable", "tool.upstream_5xx", None),
        ("500", "unknown", "tool.upstream_5xx", None),
        ("401", "rejected", "tool.auth_failed", None),
        ("400", "rejected", "tool.validation_failed", None),
        ("409", "rejected", "tool.rejected", None),
        ("html", "retryable", "tool.upstream_5xx", None),
    ],
)
def test_status_codes_keep_their_meaning(
    server: _Server, step: str, kind: str, error_name: str, retry_after: float | None
) -> None:
    server.plan = [step]

    outcome = send(_claim(1))

    assert (outcome.kind, outcome.error_name, outcome.retry_after) == (
        kind,
        error_name,
        retry_after,
    )
    assert outcome.replayed == (step == "replayed")
    if step == "409":
        assert outcome.message == "409 conflict: already refunded"


def test_traced_a_write_goes_through_httpx_with_the_same_rules(
    server: _Server, monkeypatch
) -> None:
    # httpx's instrumentation gives a traced write its span and traceparent header.
    monkeypatch.setattr(telemetry, "enabled", lambda: True)
    server.plan = ["ok", "reset", "slow"]

    outcomes = [send(_claim(1)), send(_claim(2)), send(_claim(3))]

    assert _kinds(*outcomes) == [
        ("confirmed", ""),
        ("unknown", "tool.connection_lost"),
        ("unknown", "tool.timeout"),
    ]
    assert server.received[0]["headers"]["User-Agent"].startswith("python-httpx")
    assert server.received[0]["headers"]["Idempotency-Key"] == "key_1"


def test_with_a_proxy_in_the_environment_a_write_goes_through_httpx(
    server: _Server, monkeypatch
) -> None:
    # httpx honours HTTP(S)_PROXY and http.client does not; NO_PROXY lets this one through.
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    connectors._proxy_configured.cache_clear()
    monkeypatch.setattr(connectors, "_client", lambda: httpx.Client())
    try:
        outcome = send(_claim(1))
    finally:
        connectors._proxy_configured.cache_clear()

    assert _kinds(outcome) == [("confirmed", "")]
    assert server.received[0]["headers"]["User-Agent"].startswith("python-httpx")


# --- TLS --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A self-signed certificate for 127.0.0.1 (cert and key in one file)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    folder = tmp_path_factory.mktemp("tls")
    pem = folder / "server.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(pem), "-out", str(pem)),
        ],
        check=True,
        capture_output=True,
    )
    return pem


@pytest.fixture
def tls_server(settings: Any, certificate: Path) -> Iterator[_Server]:
    httpd = _Server()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    httpd.scheme = "https"
    settings.COUNTERSIGN_CONNECTORS = {"acme": {"payments": {"base_url": httpd.url, "token": "k"}}}
    settings.TOOLCALL_TIMEOUT_OVERRIDE = 2.0
    yield from _serve(httpd)


def test_over_tls_writes_share_a_verified_connection_and_a_closed_one_is_replaced(
    tls_server: _Server, certificate: Path, monkeypatch
) -> None:
    trusting = ssl.create_default_context(cafile=str(certificate))
    monkeypatch.setattr(keepalive, "_tls", trusting)
    tls_server.plan = ["ok", "ok_then_idle_close"]

    outcomes = [send(_claim(1)), send(_claim(2))]
    assert tls_server.closed.wait(2)
    outcomes.append(send(_claim(3)))

    assert _kinds(*outcomes) == [("confirmed", "")] * 3
    ports = [r["port"] for r in tls_server.received]
    assert ports[0] == ports[1] != ports[2]
    assert len(tls_server.received) == 3


def test_over_tls_an_untrusted_certificate_means_not_sent(
    tls_server: _Server, certificate: Path, monkeypatch
) -> None:
    monkeypatch.setattr(keepalive, "_tls", None)  # httpx's trust: certifi's roots

    outcome = send(_claim(1))

    assert _kinds(outcome) == [("retryable", "tool.unreachable")]
    assert "CERTIFICATE_VERIFY_FAILED" in outcome.message
    assert tls_server.received == []
    # Trusted, the next write is sent: a refused handshake left nothing behind.
    monkeypatch.setattr(keepalive, "_tls", ssl.create_default_context(cafile=str(certificate)))
    assert _kinds(send(_claim(2))) == [("confirmed", "")]


# --- against the sandbox ---------------------------------------------------------------------


def test_after_the_sandbox_restarted_a_write_goes_once_on_a_new_connection(
    run: Run, sandbox: Sandbox
) -> None:
    call = propose_in(run)  # its read of the order leaves this thread a kept-alive connection
    sandbox.stop()
    sandbox.start()  # the old process's sockets are closed: the kept one is dead

    dispatch.tool_call_dispatch(tool_call_id=call.pk)

    call = fresh(call)
    assert [a.classification for a in call.attempts.all()] == ["confirmed"]
    effects = sandbox.effects_for(call.external_request_id)
    assert [e["idempotency_key"] for e in effects] == [call.idempotency_key]
