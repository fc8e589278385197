"""Reads at an external system keep their connection alive, replace one the server closed
while it was idle, and report a host that does not answer (toolcalls/keepalive.py), against
a real HTTP server on a real socket."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from toolcalls import keepalive


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:
        body = json.dumps({"path": self.path, "port": self.client_address[1]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        # Closed without saying so, as a server's idle timeout does between two requests.
        self.close_connection = self.server.close_silently

    def do_POST(self) -> None:
        received = self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"path": self.path, "received": received.decode()}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    close_silently = False


@pytest.fixture
def server() -> Iterator[_Server]:
    httpd = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _url(httpd: _Server, path: str) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}{path}"


def test_reads_on_one_thread_share_one_connection(server: _Server) -> None:
    first = keepalive.get(_url(server, "/orders/1?x=1"), {}, timeout=5).json()
    second = keepalive.get(_url(server, "/orders/2"), {}, timeout=5).json()

    assert (first["path"], second["path"]) == ("/orders/1?x=1", "/orders/2")
    assert first["port"] == second["port"]  # the same client socket


def test_a_connection_the_server_closed_is_replaced(server: _Server) -> None:
    server.close_silently = True
    first = keepalive.get(_url(server, "/a"), {}, timeout=5)
    second = keepalive.get(_url(server, "/b"), {}, timeout=5)

    assert (first.status, second.status) == (200, 200)
    assert first.json()["port"] != second.json()["port"]


def test_a_host_that_does_not_answer_is_reported() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # nothing listens on it

    with pytest.raises(keepalive.ReadFailed, match="ConnectionRefusedError"):
        keepalive.get(f"http://127.0.0.1:{port}/orders/1", {}, timeout=2)


def test_a_write_goes_out_in_one_send(server: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[bytes] = []
    original = socket.socket.sendall

    def sendall(sock: socket.socket, data: bytes, *args: object) -> None:
        if bytes(data).startswith(b"POST "):  # the client's, not the test server's answers
            sent.append(bytes(data))
        original(sock, data, *args)

    monkeypatch.setattr(socket.socket, "sendall", sendall)
    body = json.dumps({"amount_cents": 100, "note": "é"}).encode()
    headers = {"Content-Type": "application/json", "Idempotency-Key": "k-1"}
    answer = keepalive.send("POST", _url(server, "/refunds"), headers, body, timeout=5)

    assert answer.status == 201
    assert answer.json() == {"path": "/refunds", "received": body.decode()}
    assert len(sent) == 1  # the head and the body together (http.client's own: two sends)
    head, _, rest = sent[0].partition(b"\r\n\r\n")
    assert rest == body
    assert head.startswith(b"POST /refunds HTTP/1.1\r\n")
    assert b"\r\nContent-Length: " + str(len(body)).encode() in head
    again = keepalive.send("POST", _url(server, "/refunds"), headers, body, timeout=5)
    assert again.status == 201 and len(sent) == 2  # and the connection carries the next
