"""Reads at the external systems (business checks, verification) over kept-alive
`http.client` connections, one per thread and host.

Every proposal reads its object before it is recorded, and every verification reads it
again: through the pooled httpx client a GET cost 0.65 ms of CPU, through a kept-alive
`http.client` connection 0.11 ms (issue 12). Writes still go through httpx
(toolcalls/connectors.py): its errors are what the dispatcher's outcome rules are written
against. A GET may be sent twice, so a kept-alive connection that the server closed while
idle is replaced and the read sent again, once.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

# Connecting is bounded separately (as for writes): a host that does not accept in this long
# is down, whatever the read timeout.
CONNECT_TIMEOUT = 3.0

_local = threading.local()


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class ReadFailed(Exception):
    """No answer: refused, reset, timed out, or not HTTP. The message names the cause."""


def _connections() -> dict[tuple[str, str], http.client.HTTPConnection]:
    # A connection made before a fork shares its socket with the parent: a child starts anew.
    if getattr(_local, "pid", None) != os.getpid():
        _local.pid, _local.connections = os.getpid(), {}
    return _local.connections


def _connect(scheme: str, netloc: str, timeout: float) -> http.client.HTTPConnection:
    kind = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    connection = kind(netloc, timeout=min(timeout, CONNECT_TIMEOUT))
    connection.connect()
    connection.sock.settimeout(timeout)
    return connection


def get(url: str, headers: dict[str, str], *, timeout: float) -> Answer:
    """GET `url` on this thread's kept-alive connection to its host."""
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connections = _connections()
    slot = (parts.scheme, parts.netloc)
    for reused in (slot in connections, False):
        connection = connections.pop(slot, None)
        try:
            if connection is None:
                connection = _connect(parts.scheme, parts.netloc, timeout)
            connection.sock.settimeout(timeout)
            connection.request("GET", target, headers=headers)
            response = connection.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as exc:
            if connection is not None:
                connection.close()
            if reused and isinstance(exc, _STALE):
                continue  # the server closed it while it was idle: a new one, once
            raise ReadFailed(type(exc).__name__) from exc
        if response.will_close:
            connection.close()
        else:
            connections[slot] = connection
        return Answer(response.status, body)
    raise AssertionError("unreachable: the second try returns or raises")


# What a kept-alive connection closed by the server looks like on its next request.
_STALE = (
    http.client.RemoteDisconnected,
    http.client.BadStatusLine,
    ConnectionResetError,
    BrokenPipeError,
    ConnectionAbortedError,
)
