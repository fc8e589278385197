"""HTTP front of the sandbox: routing, auth, idempotency, fault injection, admin endpoints.

Standard library only. ``ThreadingHTTPServer`` with HTTP/1.1 keep-alive gives one thread per
connection; all database work is serialized by the store's lock, which is what makes concurrent
requests with one Idempotency-Key safe.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sqlite3
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .faults import SYSTEMS, FaultBoard, FaultSpecError
from .protocol import ApiError, Call, Reply, invalid
from .store import Store
from .systems import IDEMPOTENT_SYSTEMS, ROUTES, TOKENS, Route

MAX_BODY_BYTES = 1 << 20
MAX_NEW_ORDERS = 100_000

ADMIN_ROUTES: dict[str, tuple[str, ...]] = {
    "/health": ("GET",),
    "/data": ("GET",),
    "/ledger": ("GET",),
    "/faults": ("GET", "POST", "DELETE"),
    "/reset": ("POST",),
    "/orders": ("POST",),
}


def canonical_json(value: Any) -> str:
    """The form in which two request bodies are compared for idempotency."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class SandboxServer(ThreadingHTTPServer):
    """The HTTP server plus the state every handler thread shares."""

    daemon_threads = True  # a handler sleeping in delay_response must not block shutdown
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 128  # the default of 5 drops connections under benchmark bursts

    def __init__(
        self, address: tuple[str, int], store: Store, faults: FaultBoard, *, quiet: bool = False
    ) -> None:
        self.store = store
        self.faults = faults
        self.quiet = quiet
        self._log_lock = threading.Lock()
        super().__init__(address, SandboxHandler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def log(self, line: str) -> None:
        if not self.quiet:
            with self._log_lock:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()


class SandboxHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "CountersignSandbox/1.0"
    # Headers and body go out in separate writes; without TCP_NODELAY, Nagle plus delayed ACKs
    # add ~40 ms to keep-alive requests.
    disable_nagle_algorithm = True
    server: SandboxServer

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_DELETE = do_PUT = do_PATCH = do_GET

    # -- request lifecycle -----------------------------------------------------------------------

    def _handle(self) -> None:
        started = time.perf_counter()
        self._log_note = ""  # faults that fired, "replayed": appended to the log line
        split = urlsplit(self.path)
        path = split.path.rstrip("/") or "/"
        query = {name: values[-1] for name, values in parse_qs(split.query).items()}
        reply: Reply | None
        try:
            raw = self._read_body()
            reply = self._dispatch(path, query, raw)
        except ApiError as error:
            reply = error.reply()
        except Exception:  # a handler bug must answer 500, not end the connection thread
            self.server.log(traceback.format_exc().rstrip())
            reply = Reply(500, {"error": "internal_error", "message": "unexpected server error"})
        if reply is None:
            self._drop_connection()
            status = "dropped"
        else:
            self._send(reply)
            status = str(reply.status)
        elapsed_ms = (time.perf_counter() - started) * 1000
        note = f" [{self._log_note}]" if self._log_note else ""
        self.server.log(
            f"{time.strftime('%H:%M:%S')} {self.command} {self.path} {status} "
            f"{elapsed_ms:.1f}ms{note}"
        )

    def _read_body(self) -> bytes:
        # The whole body must be consumed even for requests we reject, or the next request on
        # this keep-alive connection would start in the middle of it.
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            return b""
        try:
            length = int(length_header)
            if length < 0:
                raise ValueError(length_header)
        except ValueError:
            self.close_connection = True
            raise invalid("bad Content-Length header") from None
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            raise ApiError(413, "payload_too_large", f"body larger than {MAX_BODY_BYTES} bytes")
        return self.rfile.read(length)

    def _read_chunked(self) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            try:
                size = int(self.rfile.readline(1024).split(b";")[0].strip(), 16)
            except ValueError:
                self.close_connection = True
                raise invalid("malformed chunked body") from None
            if size == 0:
                while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass  # trailers, ignored
                return b"".join(chunks)
            total += size
            if total > MAX_BODY_BYTES:
                self.close_connection = True
                raise ApiError(413, "payload_too_large", f"body larger than {MAX_BODY_BYTES} bytes")
            chunks.append(self.rfile.read(size))
            self.rfile.readline()

    def _send(self, reply: Reply) -> None:
        payload = json.dumps(reply.body, separators=(",", ":")).encode()
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            # Typical after delay_response: the client gave up waiting. The effect stands.
            self.close_connection = True

    def _drop_connection(self) -> None:
        """Close the TCP connection without a response, as a crashed or cut-off server would.

        shutdown() sends the FIN at once; close() alone would wait for the handler's file objects.
        """
        self.close_connection = True
        with contextlib.suppress(OSError):  # the client may have gone already
            self.connection.shutdown(socket.SHUT_RDWR)
        self.connection.close()

    def version_string(self) -> str:
        return self.server_version  # no Python version in the Server header

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # _handle logs one line per request itself, with timing and faults

    def log_message(self, format: str, *args: Any) -> None:
        self.server.log(f"{time.strftime('%H:%M:%S')} {format % args}")

    # -- routing ---------------------------------------------------------------------------------

    def _dispatch(self, path: str, query: dict[str, str], raw: bytes) -> Reply | None:
        if path in ADMIN_ROUTES:
            allowed = ADMIN_ROUTES[path]
            if self.command not in allowed:
                raise _method_not_allowed(allowed)
            return self._admin(path, query, raw)
        system, _, rest = path.lstrip("/").partition("/")
        if system in ROUTES:
            return self._system_request(system, "/" + rest, query, raw)
        raise ApiError(404, "route_not_found", f"no route for {path}")

    def _admin(self, path: str, query: dict[str, str], raw: bytes) -> Reply:
        server = self.server
        if path == "/health":
            return Reply(200, {"ok": True})
        if path == "/data":
            return Reply(200, server.store.snapshot())
        if path == "/ledger":
            system = query.get("system")
            if system is not None and system not in SYSTEMS:
                raise invalid(f"system must be one of {', '.join(SYSTEMS)}")
            return Reply(200, {"effects": server.store.ledger(system)})
        if path == "/reset":
            server.store.reset()
            server.faults.clear()
            return Reply(200, {"ok": True})
        if path == "/orders":
            return Reply(201, _add_orders(server.store, _parse_object(raw)))
        # /faults
        try:
            if self.command == "POST":
                server.faults.configure(_parse_object(raw))
            elif self.command == "DELETE":
                server.faults.clear(query.get("system"))
        except FaultSpecError as error:
            raise invalid(str(error)) from None
        return Reply(200, server.faults.snapshot())

    def _system_request(
        self, system: str, subpath: str, query: dict[str, str], raw: bytes
    ) -> Reply | None:
        route, params = _match(system, subpath, self.command)
        if self.headers.get("Authorization", "") != f"Bearer {TOKENS[system]}":
            raise ApiError(401, "auth_failed", f"missing or wrong bearer token for {system}")
        server = self.server
        if self.command == "GET":
            call = Call(system, {}, query, params, None, None, server.faults.lookup_lag(system))
            with server.store.read() as conn:
                return route.handler(conn, call)

        request_id = (self.headers.get("X-Request-Id") or "").strip()
        if not request_id:
            raise ApiError(400, "missing_request_id", "write requests need an X-Request-Id header")
        key = (self.headers.get("Idempotency-Key") or "").strip() or None
        body = _parse_object(raw)
        call = Call(system, body, query, params, request_id, key)

        decision = server.faults.decide(system)
        self._log_note = decision.label
        if decision.pre_commit == "drop_request_before_commit":
            return None
        if decision.pre_commit == "http_401":
            raise ApiError(401, "auth_failed", "token rejected (injected fault)")
        if decision.pre_commit == "http_429":
            raise ApiError(
                429,
                "rate_limited",
                "too many requests (injected fault)",
                {"Retry-After": str(decision.retry_after_seconds)},
            )
        if decision.pre_commit == "http_5xx":
            raise ApiError(503, "service_unavailable", "temporarily unavailable (injected fault)")

        try:
            reply = self._commit(route, call, subpath, body)
        except ApiError as error:
            reply = error.reply()  # post-commit faults hit error answers too
        if decision.drop_response:
            return None
        if decision.delay_seconds:
            time.sleep(decision.delay_seconds)
        return reply

    def _commit(self, route: Route, call: Call, subpath: str, body: dict[str, Any]) -> Reply:
        """Run a write in one transaction, replaying or recording it under its Idempotency-Key.

        Only successful (2xx) answers are recorded: a rejected request has no effect, so a retry
        with the same key is evaluated afresh.
        """
        key = call.idempotency_key if call.system in IDEMPOTENT_SYSTEMS else None
        # The path is part of the fingerprint so one key cannot be reused across endpoints.
        fingerprint = f"{self.command} {subpath}\n{canonical_json(body)}"
        with self.server.store.transaction() as conn:
            if key is not None:
                stored = Store.stored_response(conn, call.system, key)
                if stored is not None:
                    if stored.fingerprint != fingerprint:
                        raise ApiError(
                            422,
                            "idempotency_key_reuse",
                            f"Idempotency-Key {key!r} was used with a different request",
                        )
                    self._log_note = ",".join(filter(None, [self._log_note, "replayed"]))
                    return Reply(
                        stored.status, json.loads(stored.body), {"Idempotent-Replayed": "true"}
                    )
            reply = route.handler(conn, call)
            if key is not None and 200 <= reply.status < 300:
                Store.store_response(
                    conn, call.system, key, fingerprint, reply.status, json.dumps(reply.body)
                )
        return reply


def _match(system: str, subpath: str, method: str) -> tuple[Route, dict[str, str]]:
    allowed: list[str] = []
    for route in ROUTES[system]:
        found = route.pattern.match(subpath)
        if found is None:
            continue
        if route.method == method:
            return route, found.groupdict()
        allowed.append(route.method)
    if allowed:
        raise _method_not_allowed(tuple(allowed))
    raise ApiError(404, "route_not_found", f"no route for /{system}{subpath}")


def _method_not_allowed(allowed: tuple[str, ...]) -> ApiError:
    return ApiError(
        405, "method_not_allowed", f"allowed: {', '.join(allowed)}", {"Allow": ", ".join(allowed)}
    )


def _add_orders(store: Store, body: dict[str, Any]) -> dict[str, Any]:
    """`POST /orders`: fresh orders for a benchmark, so that no order's answer grows with the
    number of calls (each call refunds an order of its own)."""
    tenant, first, count = body.get("tenant"), body.get("first"), body.get("count")
    captured = body.get("captured_cents", 100)
    if not isinstance(tenant, str) or not tenant:
        raise invalid("tenant must be a tenant's slug")
    for name, value in (("first", first), ("count", count), ("captured_cents", captured)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise invalid(f"{name} must be a positive integer")
    if count > MAX_NEW_ORDERS or first + count > 10**7:
        raise invalid(f"at most {MAX_NEW_ORDERS} orders, numbered below 10000000")
    try:
        store.add_orders(tenant, range(first, first + count), captured)
    except sqlite3.IntegrityError:
        raise invalid("one of these order numbers exists already") from None
    return {"first": f"order-{first:03d}", "count": count}


def _parse_object(raw: bytes) -> dict[str, Any]:
    """A JSON object body; an empty body counts as ``{}`` (release/cancel need none)."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise invalid(f"body is not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise invalid("body must be a JSON object")
    return value


# -- entry points --------------------------------------------------------------------------------


def make_server(
    *,
    host: str = "127.0.0.1",
    port: int = 8700,
    data_dir: str | Path = "var/sandbox",
    reset: bool = False,
    quiet: bool = False,
    extra_tenants: tuple[str, ...] = (),
) -> SandboxServer:
    """Open (creating and seeding if needed) the data dir and bind; call serve_forever() next."""
    store = Store(data_dir, reset=reset, extra_tenants=extra_tenants)
    try:
        return SandboxServer((host, port), store, FaultBoard(), quiet=quiet)
    except BaseException:
        store.close()
        raise


def serve(
    *,
    host: str = "127.0.0.1",
    port: int = 8700,
    data_dir: str | Path = "var/sandbox",
    reset: bool = False,
    quiet: bool = False,
    extra_tenants: tuple[str, ...] = (),
) -> None:
    """Run the sandbox until SIGTERM or SIGINT, then close the socket and the database."""
    server = make_server(
        host=host,
        port=port,
        data_dir=data_dir,
        reset=reset,
        quiet=quiet,
        extra_tenants=extra_tenants,
    )

    def stop(signum: int, frame: object) -> None:
        # shutdown() waits for serve_forever() to return, which runs on this very (main) thread,
        # so it has to be called from another thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
    # Always printed, even with --quiet: it tells which port was bound (useful with --port 0).
    sys.stderr.write(f"sandbox listening on {server.url} (data: {server.store.path})\n")
    sys.stderr.flush()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        server.store.close()
        sys.stderr.write("sandbox stopped\n")
        sys.stderr.flush()
