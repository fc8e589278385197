"""HTTP to the external systems, with per-tenant endpoints and credentials from server config.

Credentials come from settings (COUNTERSIGN_CONNECTORS, or the sandbox's development tokens
for a tenant with none) at the moment of the request. They never enter tool arguments, events,
pages or logs: nothing here logs a header, and `Endpoint.__repr__` hides the token.
"""

from __future__ import annotations

import functools
import json as jsonlib
import os
import threading
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import httpx
from django.conf import settings

from config import telemetry
from toolcalls import keepalive

# The sandbox's development credentials: used only for tenants without configured connectors.
SANDBOX_TOKENS = {
    "payments": "dev-payments-key",
    "warehouse": "dev-warehouse-key",
    "carrier": "dev-carrier-key",
    "mailer": "dev-mailer-key",
}


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    token: str = field(repr=False)


def endpoint_for(tenant_slug: str, system: str) -> Endpoint:
    configured = settings.COUNTERSIGN_CONNECTORS.get(tenant_slug, {}).get(system)
    if configured:
        return Endpoint(configured["base_url"].rstrip("/"), configured["token"])
    return Endpoint(f"{settings.SANDBOX_URL.rstrip('/')}/{system}", SANDBOX_TOKENS[system])


_pid_clients: dict[int, httpx.Client] = {}
_lock = threading.Lock()


def _client() -> httpx.Client:
    # One pooled client per process: a client created before a fork would share sockets with
    # the parent, so a forked worker makes its own.
    pid = os.getpid()
    client = _pid_clients.get(pid)
    if client is None:
        with _lock:
            client = _pid_clients.get(pid)
            if client is None:
                client = httpx.Client(
                    limits=httpx.Limits(max_connections=64, max_keepalive_connections=32)
                )
                _pid_clients[pid] = client
    return client


def request(
    endpoint: Endpoint,
    method: str,
    path: str,
    *,
    timeout: float,
    json: dict[str, Any] | None = None,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    return _client().request(
        method,
        endpoint.base_url + path,
        json=json,
        params=params,
        headers={"Authorization": f"Bearer {endpoint.token}", **(headers or {})},
        # Connecting is bounded separately: a refused or slow connect means nothing was sent.
        timeout=httpx.Timeout(timeout, connect=min(timeout, 3.0)),
    )


def write(
    endpoint: Endpoint,
    method: str,
    path: str,
    *,
    timeout: float,
    json: dict[str, Any] | None,
    headers: dict[str, str],
) -> keepalive.Answer:
    """A tool call's request, sent once over this thread's kept-alive connection
    (toolcalls/keepalive.py). Traced, it goes through httpx, whose instrumentation gives it
    its span and traceparent header; with a proxy in the environment too, as httpx honours
    it and http.client does not. Raises keepalive's errors or httpx's accordingly."""
    if telemetry.enabled() or _proxy_configured():
        response = request(endpoint, method, path, timeout=timeout, json=json, headers=headers)
        return keepalive.Answer(response.status_code, response.content, response.headers)
    all_headers = {"Authorization": f"Bearer {endpoint.token}", **headers}
    body = None
    if json is not None:
        # The bytes httpx sent for `json=`, so a retry's body is the first one's.
        body = jsonlib.dumps(json, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        all_headers["Content-Type"] = "application/json"
    return keepalive.send(
        method,
        endpoint.base_url + path,
        all_headers,
        None if body is None else body.encode(),
        timeout=timeout,
    )


@functools.cache
def _proxy_configured() -> bool:
    # The proxies httpx reads (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY): httpx then applies NO_PROXY.
    return any(urllib.request.getproxies().get(scheme) for scheme in ("http", "https", "all"))
