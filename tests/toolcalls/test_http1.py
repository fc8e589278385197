"""toolcalls/http1.py reads what http.client reads and writes what it writes: each response
below is served as exact bytes by a real server on a real socket, and read once by
http.client and once by http1 (status, body, headers, whether the connection closes after
it); each request is sent by both and the bytes the server got compared. Then the kept-alive
client on it: chunked and Content-Length answers in turn on one connection."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from toolcalls import http1, keepalive


class _Scripted:
    """Answers each connection's requests with the next scripted bytes, sent in pieces of
    `piece` bytes (1: byte by byte, each its own TCP segment), then closes the connection
    if `close` is set. Keeps the bytes of every request it got."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.answers: list[tuple[bytes, bool]] = []
        self.piece = 1 << 16
        self.received: list[bytes] = []
        self.ports: list[int] = []
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(client,), daemon=True).start()

    def _connection(self, client: socket.socket) -> None:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with client:
            pending = b""
            while True:
                while b"\r\n\r\n" not in pending:
                    data = client.recv(65536)
                    if not data:
                        return
                    pending += data
                head, _, rest = pending.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                while len(rest) < length:
                    rest += client.recv(65536)
                self.received.append(head + b"\r\n\r\n" + rest[:length])
                self.ports.append(client.getpeername()[1])
                pending = rest[length:]
                answer, close = self.answers.pop(0) if self.answers else (_OK, False)
                for start in range(0, len(answer), self.piece):
                    client.sendall(answer[start : start + self.piece])
                    if self.piece < 16:
                        time.sleep(0.0005)
                if close:
                    client.shutdown(socket.SHUT_WR)
                    return

    def stop(self) -> None:
        self._stop = True
        self.listener.close()


_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


@pytest.fixture
def server() -> Iterator[_Scripted]:
    scripted = _Scripted()
    yield scripted
    scripted.stop()


_NAMES = ("content-type", "Content-Length", "x-token", "Retry-After", "connection", "Missing")


def _by_http_client(port: int) -> tuple:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/orders/1")
        response = connection.getresponse()
        body = response.read()
        headers = {name: response.headers.get(name) for name in _NAMES}
        return response.status, body, headers, bool(response.will_close)
    finally:
        connection.close()


def _by_http1(port: int) -> tuple:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(http1.request_bytes("GET", "/orders/1", b"127.0.0.1", {}, None))
        buffer = bytearray()
        status, headers, body, will_close = http1.read_response(sock, buffer, "GET")
        assert buffer == bytearray()  # nothing read past the response
        return status, body, {name: headers.get(name) for name in _NAMES}, will_close


_RESPONSES = {
    "content-length": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    b'Content-Length: 12\r\nX-Token: a b \r\n\r\n{"ok": true}',
    "chunked, with extensions and trailers": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
    b"\r\n4;name=x\r\nWiki\r\n6\r\npedia \r\nE\r\nin \r\n\r\nchunks.\r\n0\r\nX-Trailer: 1\r\n\r\n",
    "chunked in any case, its Content-Length ignored": b"HTTP/1.1 200 OK\r\n"
    b"Transfer-Encoding: Chunked\r\nContent-Length: 99\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    "no length: the body runs to the end": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
    b"\r\nall of this, until the server closes",
    "HTTP/1.0 closes": b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nabc",
    "HTTP/1.0 with keep-alive": b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\n"
    b"Content-Length: 3\r\n\r\nabc",
    "HTTP/1.0 with a Keep-Alive header": b"HTTP/1.0 200 OK\r\nKeep-Alive: timeout=5\r\n"
    b"Content-Length: 3\r\n\r\nabc",
    "Connection: close": b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\n"
    b"Connection: close\r\nContent-Length: 2\r\n\r\n{}",
    "204 has no body": b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
    "304 has no body": b"HTTP/1.1 304 Not Modified\r\n\r\n",
    "100 Continue first": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\n"
    b"Content-Length: 2\r\n\r\nok",
    "lines ended by LF alone": b"HTTP/1.1 200 OK\nContent-Length: 2\nX-Token: t\n\nok",
    "names in any case, the first of a repeated one": b"HTTP/1.1 200 OK\r\n"
    b"x-TOKEN: first\r\nX-Token: second\r\ncontent-length: 2\r\n\r\nok",
    "a reason with spaces, or none": b"HTTP/1.1 503\r\nContent-Length: 0\r\n\r\n",
    "a negative or unreadable length: to the end": b"HTTP/1.1 200 OK\r\n"
    b"Content-Length: -4\r\n\r\nuntil the end",
    "a non-ASCII header value": b"HTTP/1.1 200 OK\r\nX-Token: caf\xe9\r\nContent-Length: 0\r\n\r\n",
}


@pytest.mark.parametrize("piece", [1 << 16, 1], ids=["in one piece", "byte by byte"])
@pytest.mark.parametrize("name", list(_RESPONSES))
def test_a_response_reads_as_http_client_reads_it(server: _Scripted, name: str, piece: int) -> None:
    answer = _RESPONSES[name]
    # A body that runs to the end needs the server to close; others are closed as well,
    # after the answer, so that a read past the answer would show.
    server.answers = [(answer, True), (answer, True)]
    server.piece = piece

    expected = _by_http_client(server.port)
    assert _by_http1(server.port) == expected


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"", http.client.RemoteDisconnected),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", http.client.IncompleteRead),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            http.client.IncompleteRead,
        ),
        (b"SMTP ready\r\n\r\n", http.client.BadStatusLine),
        (b"HTTP/1.1 2000 Odd\r\n\r\n", http.client.BadStatusLine),
        (b"HTTP/2.0 200 OK\r\n\r\n", http.client.UnknownProtocol),
    ],
    ids=["closed unanswered", "short body", "bad chunk size", "not HTTP", "bad status", "HTTP/2"],
)
def test_a_broken_response_raises_what_http_client_raises(
    server: _Scripted, answer: bytes, error: type[Exception]
) -> None:
    server.answers = [(answer, True), (answer, True)]

    with pytest.raises(error):
        _by_http_client(server.port)
    with pytest.raises(error):
        _by_http1(server.port)


def _sent_by_http_client(
    server: _Scripted, method: str, headers: dict, body: bytes | None
) -> bytes:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        connection.request(method, "/refunds?x=1", body=body, headers=headers)
        connection.getresponse().read()
    finally:
        connection.close()
    return server.received[-1]


def _sent_by_http1(server: _Scripted, method: str, headers: dict, body: bytes | None) -> bytes:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    host = http1.host_header(connection)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(http1.request_bytes(method, "/refunds?x=1", host, headers, body))
        http1.read_response(sock, bytearray(), method)
    return server.received[-1]


@pytest.mark.parametrize(
    ("method", "headers", "body"),
    [
        ("GET", {"Authorization": "Bearer k"}, None),
        ("POST", {"Content-Type": "application/json", "Idempotency-Key": "é-1"}, b'{"a": 1}'),
        ("POST", {"X-Request-Id": "req_1"}, None),
        ("PUT", {"Host": "payments.example", "Accept-Encoding": "gzip"}, b"x"),
        ("DELETE", {}, None),
    ],
)
def test_a_request_is_the_bytes_http_client_sends(
    server: _Scripted, method: str, headers: dict, body: bytes | None
) -> None:
    assert _sent_by_http1(server, method, headers, body) == _sent_by_http_client(
        server, method, headers, body
    )


@pytest.mark.parametrize(
    ("target", "headers", "error"),
    [
        ("/a b", {}, http.client.InvalidURL),
        ("/a\r\nX-Injected: 1", {}, http.client.InvalidURL),
        ("/a", {"X-Key": "k\r\nX-Injected: 1"}, ValueError),
        ("/a", {"X:Y": "v"}, ValueError),
        ("/café", {}, UnicodeEncodeError),
    ],
)
def test_a_request_http_client_refuses_is_refused(
    target: str, headers: dict, error: type[Exception]
) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", 9)
    with pytest.raises(error):
        connection.putrequest("GET", target)
        for name, value in headers.items():
            connection.putheader(name, value)
    with pytest.raises(error):
        http1.request_bytes("GET", target, b"127.0.0.1:9", headers, None)


@pytest.mark.parametrize(
    ("host", "port"),
    [
        ("127.0.0.1", 80),
        ("127.0.0.1", 8080),
        ("[::1]:8080", None),
        ("::1", 8080),
        ("[fe80::1%eth0]", None),
        ("bücher.example", None),
    ],
)
def test_the_host_header_is_http_client_s(host: str, port: int | None) -> None:
    connection = http.client.HTTPConnection(host, port)
    connection.putrequest("GET", "/")  # into its buffer, not sent
    sent = [line for line in connection._buffer if line.startswith(b"Host: ")]  # type: ignore[attr-defined]

    assert [b"Host: " + http1.host_header(connection)] == sent


# --- the kept-alive client on it --------------------------------------------------------------


@pytest.fixture(autouse=True)
def fresh_connections() -> None:
    keepalive._local.__dict__.clear()  # this thread's connections from earlier tests


def test_chunked_and_sized_answers_in_turn_share_one_connection(server: _Scripted) -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    server.answers = [(chunked, False), (_OK, False), (chunked, False)]
    server.piece = 7  # answers split across segments

    url = f"http://127.0.0.1:{server.port}/orders/1"
    answers = [keepalive.get(url, {"Authorization": "Bearer k"}, timeout=5) for _ in range(3)]

    assert [(a.status, a.json()) for a in answers] == [(200, {})] * 3
    assert len(set(server.ports)) == 1  # the same client socket
    assert server.received[0].startswith(b"GET /orders/1 HTTP/1.1\r\nHost: 127.0.0.1:")


def test_a_connection_that_says_close_or_sends_more_than_asked_is_not_reused(
    server: _Scripted,
) -> None:
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    stray = _OK + b"HTTP/1.1 200 OK\r\n"  # bytes past the answer: out of step
    server.answers = [(closing, False), (stray, False), (_OK, False)]

    url = f"http://127.0.0.1:{server.port}/orders/1"
    statuses = [keepalive.get(url, {}, timeout=5).status for _ in range(3)]

    assert statuses == [200, 200, 200]
    assert len(set(server.ports)) == 3


def test_a_write_s_answer_headers_read_in_any_case(server: _Scripted) -> None:
    server.answers = [
        (b"HTTP/1.1 200 OK\r\nidempotent-replayed: true\r\nContent-Length: 2\r\n\r\n{}", False)
    ]

    answer = keepalive.send("POST", f"http://127.0.0.1:{server.port}/refunds", {}, b"{}", timeout=5)

    assert answer.header("Idempotent-Replayed") == "true"
    assert answer.header("Retry-After") == ""


@pytest.mark.parametrize(
    "answer",
    [
        b"",
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 201 Created\r\nContent-Le",
        b"HTTP/1.1 2x1 Created\r\n\r\n",
        b"SMTP ready\r\n\r\n",
        b"HTTP/1.1 201 Created\r\nContent-Length: 30\r\n\r\n{}",
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
    ids=[
        "closed unanswered",
        "closed after 100 Continue",
        "head cut off",
        "garbled status",
        "not HTTP",
        "body cut off",
        "chunked body cut off",
        "bad chunk size",
    ],
)
def test_a_write_s_lost_or_garbled_answer_is_answer_lost_and_not_sent_again(
    server: _Scripted, answer: bytes
) -> None:
    # The request reached the server: whatever comes back broken, the write's result is
    # unknown (toolcalls/send.py: "unknown"), never "not sent" nor a status to act on.
    server.answers = [(answer, True)]

    with pytest.raises(keepalive.AnswerLost):
        keepalive.send("POST", f"http://127.0.0.1:{server.port}/refunds", {}, b"{}", timeout=5)

    assert len(server.received) == 1

@pytest.mark.parametrize(
    ("url", "slot", "target"),
    [
        ("http://127.0.0.1:8/orders/1?x=1#frag", ("http", "127.0.0.1:8"), "/orders/1?x=1"),
        ("HTTPS://h.example", ("https", "h.example"), "/"),
        ("http://h.example?x=1", ("http", "h.example"), "/?x=1"),
        ("http://h.example/p?", ("http", "h.example"), "/p"),
        ("http://[::1]:8/a/b", ("http", "[::1]:8"), "/a/b"),
    ],
)
def test_a_url_splits_as_urlsplit_splits_it(url: str, slot: tuple, target: str) -> None:
    assert keepalive._split(url) == (slot, target)
