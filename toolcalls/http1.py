"""One HTTP/1.1 exchange on a connected socket: the request's bytes, and the response read
into status, headers and body (toolcalls/keepalive.py keeps the connections).

`http.client` parsed every response's headers with the `email` package: about 240 Python
calls per response, a sixth of a proposal's (its business check reads one order;
profile_propose). Here the head is split on its line ends and each header line on its colon,
the framing rules kept as http.client applies them: a body by `Transfer-Encoding: chunked`,
else by `Content-Length`, else up to the end of the connection; none for 1xx, 204 and 304;
HTTP/1.1 keeps its connection unless `Connection: close`, HTTP/1.0 closes it unless it says
keep-alive. The request is checked as http.client checks one (no control characters or
spaces in the path, no CR/LF that would start another header) and goes in one send, its
body too. Errors are http.client's own classes (RemoteDisconnected when the server closed
the connection before answering at all, BadStatusLine, IncompleteRead, LineTooLong) or the
socket's OSError, so callers tell a stale connection from a lost answer as before.
tests/toolcalls/test_http1.py checks it against real servers on real sockets.
"""

from __future__ import annotations

import re
import socket
import ssl
from http.client import (
    BadStatusLine,
    HTTPConnection,
    HTTPException,
    IncompleteRead,
    InvalidURL,
    LineTooLong,
    RemoteDisconnected,
    UnknownProtocol,
)

# http.client's limits: one line of the head, and the number of headers.
MAX_LINE = 65536
MAX_HEADERS = 100
_READ_SIZE = 65536

# http.client's checks of what goes on the request's head.
_ILLEGAL_PATH = re.compile("[\x00-\x20\x7f]").search
_ILLEGAL_METHOD = re.compile("[\x00-\x1f]").search
_LEGAL_NAME = re.compile(rb"[^:\s][^:\r\n]*").fullmatch
_ILLEGAL_VALUE = re.compile(rb"\n(?![ \t])|\r(?![ \t\n])").search
# http.client sends `Content-Length: 0` for these without a body.
_EXPECTING_BODY = frozenset({"PATCH", "POST", "PUT"})


class Headers(dict):
    """A response's headers by lower-case name (the first of a repeated one, as
    http.client's `get` answers); `get` takes a name in any case."""

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return dict.get(self, name.lower(), default)


def host_header(connection: HTTPConnection) -> bytes:
    """The Host header http.client sends on `connection`'s requests."""
    host, port = connection.host, connection.port
    try:
        encoded = host.encode("ascii")
    except UnicodeEncodeError:
        encoded = host.encode("idna")
    if ":" in host:  # IPv6, in brackets, without its zone
        encoded = b"[" + encoded.partition(b"%")[0] + b"]"
    if port == connection.default_port:
        return encoded
    return encoded + b":" + str(port).encode("ascii")


def request_bytes(
    method: str, target: str, host: bytes, headers: dict[str, str], body: bytes | None
) -> bytes:
    """The request as http.client writes it: request line, Host, Accept-Encoding, the
    Content-Length of a body (0 for a POST, PUT or PATCH without one), then `headers`.
    Raises ValueError (InvalidURL for the path) where http.client refuses it."""
    if _ILLEGAL_METHOD(method):
        raise ValueError(f"method can't contain control characters. {method!r}")
    if _ILLEGAL_PATH(target):
        raise InvalidURL(f"URL can't contain control characters. {target!r}")
    lines = [f"{method} {target} HTTP/1.1".encode("ascii")]
    names = {name.lower() for name in headers}
    if "host" not in names:
        lines.append(b"Host: " + host)
    if "accept-encoding" not in names:
        lines.append(b"Accept-Encoding: identity")
    if "content-length" not in names:
        if body is not None:
            lines.append(b"Content-Length: " + str(len(body)).encode("ascii"))
        elif method.upper() in _EXPECTING_BODY:
            lines.append(b"Content-Length: 0")
    for name, value in headers.items():
        encoded_name = name.encode("ascii")
        if not _LEGAL_NAME(encoded_name):
            raise ValueError(f"Invalid header name {encoded_name!r}")
        encoded = value.encode("latin-1")
        if _ILLEGAL_VALUE(encoded):
            raise ValueError(f"Invalid header value {encoded!r}")
        lines.append(encoded_name + b": " + encoded)
    lines.append(b"\r\n")
    head = b"\r\n".join(lines)
    return head if body is None else head + body


def read_response(
    sock: socket.socket | ssl.SSLSocket, buffer: bytearray, method: str
) -> tuple[int, Headers, bytes, bool]:
    """(status, headers, body, will_close) of the response to a `method` request, read from
    `sock` through `buffer` (bytes received and not yet used; after a whole response anything
    left there was not asked for)."""
    while True:
        status, version, headers = _read_head(sock, buffer)
        if not 100 <= status < 200 or status == 101:
            break  # an interim answer (100 Continue, 103 Early Hints) precedes the response
    will_close = _will_close(version, headers)
    chunked = (headers.get("transfer-encoding") or "").lower() == "chunked"
    length = None if chunked else _length(headers.get("content-length"))
    if status in (204, 304) or 100 <= status < 200 or method == "HEAD":
        return status, headers, b"", will_close
    if chunked:
        return status, headers, _read_chunked(sock, buffer), will_close
    if length is None:
        return status, headers, _read_to_end(sock, buffer), True
    return status, headers, _read_exactly(sock, buffer, length), will_close


def _receive(sock: socket.socket | ssl.SSLSocket, buffer: bytearray) -> bool:
    """More bytes into `buffer`; False at the end of the connection."""
    data = sock.recv(_READ_SIZE)
    buffer += data
    return bool(data)


def _read_head(sock: socket.socket | ssl.SSLSocket, buffer: bytearray) -> tuple[int, int, Headers]:
    start = 0
    while True:
        end = buffer.find(b"\n\r\n", start)
        bare = buffer.find(b"\n\n", start)
        if bare >= 0 and (end < 0 or bare < end):
            end, skip = bare, 2  # lines ended by LF alone, which http.client takes too
        else:
            skip = 3
        if end >= 0:
            break
        start = max(0, len(buffer) - 2)
        if len(buffer) > MAX_LINE * (MAX_HEADERS + 1):
            raise LineTooLong("header line")
        if not _receive(sock, buffer):
            if not buffer:
                raise RemoteDisconnected("Remote end closed connection without response")
            raise IncompleteRead(bytes(buffer))
    head = buffer[:end].decode("iso-8859-1")
    del buffer[: end + skip]
    lines = head.split("\n")
    status_line = lines[0].rstrip("\r")
    if len(status_line) > MAX_LINE:
        raise LineTooLong("status line")
    if len(lines) - 1 > MAX_HEADERS:
        raise HTTPException(f"got more than {MAX_HEADERS} headers")
    return (*_status(status_line), _headers(lines))


def _status(line: str) -> tuple[int, int]:
    """(status, version: 10 or 11) of a status line, as http.client reads one."""
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise BadStatusLine(line)
    try:
        status = int(parts[1])
    except ValueError:
        raise BadStatusLine(line) from None
    if not 100 <= status <= 999:
        raise BadStatusLine(line)
    version = parts[0]
    if version in ("HTTP/1.0", "HTTP/0.9"):
        return status, 10
    if version.startswith("HTTP/1."):
        return status, 11
    raise UnknownProtocol(version)


def _headers(lines: list[str]) -> Headers:
    headers = Headers()
    last = ""
    for line in lines[1:]:
        line = line.rstrip("\r")
        if len(line) > MAX_LINE:
            raise LineTooLong("header line")
        if line[:1] in (" ", "\t"):  # a folded line continues the header before it
            if last:
                headers[last] += " " + line.strip(" \t")
            continue
        name, colon, value = line.partition(":")
        if not colon:
            continue  # not a header: http.client's parser sets such lines aside too
        last = name.lower()
        if last not in headers:
            headers[last] = value.lstrip(" \t")  # trailing spaces kept, as http.client keeps them
        else:
            last = ""  # a repeated header: the first one answers, as in http.client
    return headers


def _will_close(version: int, headers: Headers) -> bool:
    connection = (headers.get("connection") or "").lower()
    if version == 11:
        return "close" in connection
    keeps = headers.get("keep-alive") or "keep-alive" in connection
    return not (keeps or "keep-alive" in (headers.get("proxy-connection") or "").lower())


def _length(value: str | None) -> int | None:
    if not value:
        return None
    try:
        length = int(value)
    except ValueError:
        return None
    return length if length >= 0 else None


def _read_exactly(sock: socket.socket | ssl.SSLSocket, buffer: bytearray, length: int) -> bytes:
    while len(buffer) < length:
        if not _receive(sock, buffer):
            partial = bytes(buffer)
            del buffer[:]
            raise IncompleteRead(partial, length - len(partial))
    body = bytes(buffer[:length])
    del buffer[:length]
    return body


def _read_to_end(sock: socket.socket | ssl.SSLSocket, buffer: bytearray) -> bytes:
    while _receive(sock, buffer):
        pass
    body = bytes(buffer)
    del buffer[:]
    return body


def _read_line(sock: socket.socket | ssl.SSLSocket, buffer: bytearray, what: str) -> bytes:
    start = 0
    while (end := buffer.find(b"\n", start)) < 0:
        start = len(buffer)
        if start > MAX_LINE:
            raise LineTooLong(what)
        if not _receive(sock, buffer):
            raise IncompleteRead(bytes(buffer))
    if end > MAX_LINE:
        raise LineTooLong(what)
    line = bytes(buffer[: end + 1])
    del buffer[: end + 1]
    return line


def _read_chunked(sock: socket.socket | ssl.SSLSocket, buffer: bytearray) -> bytes:
    chunks = []
    while True:
        line = _read_line(sock, buffer, "chunk size")
        try:
            size = int(line.split(b";", 1)[0], 16)
        except ValueError:
            raise IncompleteRead(b"".join(chunks)) from None
        if size < 0:
            raise IncompleteRead(b"".join(chunks))
        if size == 0:
            break
        chunks.append(_read_exactly(sock, buffer, size))
        _read_exactly(sock, buffer, 2)  # the CRLF after the chunk's data
    try:
        while _read_line(sock, buffer, "trailer line") not in (b"\r\n", b"\n"):
            pass  # trailers, ignored as http.client ignores them
    except IncompleteRead:
        pass  # closed after the last chunk: the body is whole (keepalive's next take sees the end)
    return b"".join(chunks)
