"""HTTP to the external systems over kept-alive `http.client` connections, one per thread and
host: reads (business checks, verification) and writes (the dispatch's send).

Through the pooled httpx client a request cost 0.65 ms of CPU, through a kept-alive
`http.client` connection 0.11 ms (issue 12). Traced processes still use httpx
(toolcalls/connectors.py): its instrumentation gives each request its span and traceparent.

A connection idle longer than `IDLE_EXPIRY`, or one the server has closed (its socket is
readable while no request is in flight), is not reused. A read (GET) may be sent twice, so a
reused connection that still turns out closed is replaced and the read sent again, once. A
write is never sent twice by this module: once it may have reached the server, any failure
is `AnswerLost`, and what happened is the caller's to find out.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

# Connecting is bounded separately: a host that does not accept in this long is down,
# whatever the read timeout.
CONNECT_TIMEOUT = 3.0
# httpx's keep-alive expiry: a server's idle timeout is rarely shorter, so a connection is
# not reused just as the server closes it (which would cost a write its answer).
IDLE_EXPIRY = 5.0

_local = threading.local()
_tls: ssl.SSLContext | None = None


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    # http.client's HTTPMessage or httpx's Headers: `get` ignores the name's case in both.
    headers: Any = None

    def json(self) -> Any:
        return json.loads(self.body)

    def header(self, name: str) -> str:
        return (self.headers.get(name) if self.headers is not None else None) or ""


class ReadFailed(Exception):
    """No answer: refused, reset, timed out, or not HTTP. The message names the cause."""


class NotSent(Exception):
    """The connection never opened (refused, unresolvable, TLS refused, connect timed out):
    not one byte of the request left this process."""


class AnswerLost(Exception):
    """The request may have reached the server, and no whole answer came back."""


class NoAnswerInTime(AnswerLost):
    """The request may have reached the server, and the answer did not come in time."""


def _connections() -> dict[tuple[str, str], http.client.HTTPConnection]:
    # A connection made before a fork shares its socket with the parent: a child starts anew.
    if getattr(_local, "pid", None) != os.getpid():
        _local.pid, _local.connections = os.getpid(), {}
    return _local.connections


def _tls_context() -> ssl.SSLContext:
    # The trust httpx gives (certifi's roots, or SSL_CERT_FILE / SSL_CERT_DIR), made once.
    global _tls
    if _tls is None:
        import httpx

        context = httpx.create_ssl_context()
        context.set_alpn_protocols(["http/1.1"])
        _tls = context
    return _tls


class _OneWrite:
    """A request's head and its body in one write. http.client sends them apart: two system
    calls and two TCP segments per write, each for the server to read (the send threads'
    CPU is most of a worker's that cProfile does not see: profile_dispatch, thread time).
    `_send_output` is where http.client sends them (the same since Python 3.0); a body that
    is not bytes (a file, chunks) still goes its way."""

    _buffer: list[bytes]

    def _send_output(self, message_body: Any = None, encode_chunked: bool = False) -> None:
        if type(message_body) is not bytes or encode_chunked:
            super()._send_output(message_body, encode_chunked)  # type: ignore[misc]
            return
        self._buffer.extend((b"", message_body))
        message = b"\r\n".join(self._buffer)
        del self._buffer[:]
        self.send(message)  # type: ignore[attr-defined]


class _Connection(_OneWrite, http.client.HTTPConnection):
    pass


class _TLSConnection(_OneWrite, http.client.HTTPSConnection):
    pass


def _connect(scheme: str, netloc: str, timeout: float) -> http.client.HTTPConnection:
    connection: http.client.HTTPConnection
    if scheme == "https":
        connection = _TLSConnection(
            netloc, timeout=min(timeout, CONNECT_TIMEOUT), context=_tls_context()
        )
    else:
        connection = _Connection(netloc, timeout=min(timeout, CONNECT_TIMEOUT))
    # http.client would otherwise reconnect by itself when its socket is gone, and send again.
    connection.auto_open = 0
    try:
        connection.connect()
    except BaseException:
        connection.close()  # a socket opened before a refused TLS handshake is not left open
        raise
    connection.sock.settimeout(timeout)
    return connection


def _closed_by_server(connection: http.client.HTTPConnection) -> bool:
    """No request is in flight, so anything to read (an EOF, a reset, stray bytes) means the
    server closed it or will not read it as a fresh exchange."""
    sock = connection.sock
    if sock is None or sock.fileno() < 0:
        return True
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    if not hasattr(select, "poll"):
        return bool(select.select([sock], [], [], 0)[0])
    poller = select.poll()  # select() fails on descriptors past 1024
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _take(slot: tuple[str, str]) -> http.client.HTTPConnection | None:
    """This thread's idle connection for `slot`, if it is still fit to carry a request."""
    connection = _connections().pop(slot, None)
    if connection is None:
        return None
    if time.monotonic() - connection.idle_since > IDLE_EXPIRY or _closed_by_server(connection):
        connection.close()
        return None
    return connection


def _keep(
    slot: tuple[str, str],
    connection: http.client.HTTPConnection,
    response: http.client.HTTPResponse,
) -> None:
    if response.will_close:
        connection.close()
        return
    connection.idle_since = time.monotonic()  # type: ignore[attr-defined]
    _connections()[slot] = connection


def _split(url: str) -> tuple[tuple[str, str], str]:
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return (parts.scheme, parts.netloc), target


def get(url: str, headers: dict[str, str], *, timeout: float) -> Answer:
    """GET `url` on this thread's kept-alive connection to its host."""
    slot, target = _split(url)
    for reused in (True, False):
        connection = _take(slot) if reused else None
        try:
            if connection is None:
                reused = False
                connection = _connect(*slot, timeout)
            connection.sock.settimeout(timeout)
            connection.request("GET", target, headers=headers)
            response = connection.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as exc:
            if connection is not None:
                connection.close()
            if reused and isinstance(exc, _STALE):
                continue  # the server closed it as we sent: a new one, once
            raise ReadFailed(type(exc).__name__) from exc
        _keep(slot, connection, response)
        return Answer(response.status, body, response.headers)
    raise AssertionError("unreachable: the second try returns or raises")


def send(
    method: str, url: str, headers: dict[str, str], body: bytes | None, *, timeout: float
) -> Answer:
    """Send one request (a write) on this thread's kept-alive connection to its host, or on a
    new one; never twice. Raises NotSent when the connection never opened, NoAnswerInTime
    or AnswerLost once the request may have reached the server."""
    slot, target = _split(url)
    connection = _take(slot)
    if connection is None:
        try:
            connection = _connect(*slot, timeout)
        except (OSError, http.client.HTTPException) as exc:
            raise NotSent(f"{type(exc).__name__}: {exc}") from exc
    try:
        connection.sock.settimeout(timeout)
        connection.request(method, target, body=body, headers=headers)
        response = connection.getresponse()
        answer = Answer(response.status, response.read(), response.headers)
    except TimeoutError as exc:  # socket.timeout is TimeoutError
        connection.close()
        raise NoAnswerInTime(f"{type(exc).__name__}: {exc}") from exc
    except (OSError, http.client.HTTPException) as exc:
        connection.close()
        raise AnswerLost(f"{type(exc).__name__}: {exc}") from exc
    _keep(slot, connection, response)
    return answer


# What a kept-alive connection closed by the server looks like on its next request.
_STALE = (
    http.client.RemoteDisconnected,
    http.client.BadStatusLine,
    ConnectionResetError,
    BrokenPipeError,
    ConnectionAbortedError,
)
