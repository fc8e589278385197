"""What tests share besides their fixtures (tests/conftest.py): the agent's side of the API,
the service side for tests that drive dispatch step by step, people's browsers, and starting
and waiting for real processes.

    call = propose(agent, BIG_REFUND)                     # over the API, in a new run: a dict
    call = propose(agent, REFUND, run_id=run_id, intent="small")
    call = propose_in(run, WAYBILL, capability="create-waybill-v1")   # the service: a ToolCall
    decide(logged_in(approver), approval_of(call), "approve")
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import http.server
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import urlsplit

import pytest
import redis
from django.test import Client

from approvals.models import Approval
from runs.models import ApiKey, Run, Tenant, User
from toolcalls import capabilities, dispatch
from toolcalls.models import ToolCall
from toolcalls.propose import tool_call_propose

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "correct-horse-battery"

# --- arguments the seeded sandbox accepts ---------------------------------------------------

REFUND = {"order_id": "order-002", "amount_cents": 2500, "currency": "USD"}
# Over $200: the default policy asks one approver (over $1,000: two).
BIG_REFUND = {
    "order_id": "order-003",
    "amount_cents": 25000,
    "currency": "USD",
    "reason": "duplicate charge",
}
WAYBILL = {"order_id": "order-002", "address_id": "addr-002"}

# --- people ---------------------------------------------------------------------------------


def make_user(username: str, tenant: Tenant, role: str) -> User:
    return User.objects.create_user(username=username, password=PASSWORD, tenant=tenant, role=role)


def logged_in(user: User) -> Client:
    """A browser session of `user` (the Django test client, logged in)."""
    client = Client()
    client.force_login(user)
    return client


def approval_of(call: dict[str, Any]) -> Approval:
    """The latest approval of a call the agent proposed."""
    return Approval.objects.filter(tool_call_id=call["tool_call_id"]).latest("created_at")


# Each decision has its own URL: approve, reject, edit (approve with edits).
def decide(client: Client, approval: Approval, action: str, **fields: Any) -> Any:
    """Post a decision from the approval page as it was rendered for `approval`."""
    return client.post(
        f"/approvals/{approval.pk}/{action}/",
        {"version": approval.version, "summary_hash": approval.summary_hash, **fields},
    )


# --- the agent's side: the API --------------------------------------------------------------


class ApiClient:
    """The Django test client, speaking JSON with one tenant's API key (`key`, when the
    test made it)."""

    def __init__(self, token: str, key: ApiKey | None = None) -> None:
        self.client = Client()
        self.token = token
        self.key = key

    def _headers(self, headers: dict[str, str] | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", **(headers or {})}

    def get(self, path: str, headers: dict[str, str] | None = None) -> Any:
        return self.client.get(path, headers=self._headers(headers))

    def post(
        self, path: str, body: Any = None, headers: dict[str, str] | None = None, raw: str = ""
    ) -> Any:
        data = raw if raw else json.dumps(body if body is not None else {})
        return self.client.post(
            path, data=data, content_type="application/json", headers=self._headers(headers)
        )

    def put(self, path: str, body: Any, headers: dict[str, str] | None = None) -> Any:
        return self.client.put(
            path,
            data=json.dumps(body),
            content_type="application/json",
            headers=self._headers(headers),
        )


def start_run(agent: ApiClient, title: str = "refund", **fields: Any) -> str:
    """The agent starts a run; returns its id."""
    response = agent.post("/api/v1/runs", {"title": title, **fields})
    assert response.status_code == 201, response.json()
    return response.json()["run_id"]


def propose(
    agent: ApiClient,
    args: dict[str, Any] = REFUND,
    *,
    capability: str = "refund-order-v2",
    intent: str = "intent-1",
    run_id: str | None = None,
    status: int = 201,
    **fields: Any,
) -> dict[str, Any]:
    """The agent proposes a call (in a new run unless `run_id` names one); the answer must
    have `status`. Returns the answer's body: the call, or the error."""
    response = agent.post(
        f"/api/v1/runs/{run_id or start_run(agent)}/tool-calls",
        {"capability": capability, "args": args, "intent": intent, **fields},
    )
    assert response.status_code == status, response.json()
    return response.json()


def tool_call_of(answer: dict[str, Any]) -> ToolCall:
    """The stored call behind the API's answer."""
    return ToolCall.objects.get(pk=answer["tool_call_id"])


# --- the service side, for tests that drive dispatch step by step ---------------------------


def propose_in(
    run: Run,
    args: dict[str, Any] = REFUND,
    *,
    capability: str = "refund-order-v2",
    intent: str = "intent-1",
    actor: str = "test",
    **fields: Any,
) -> ToolCall:
    """Propose a call in `run` through the service (`object_revision`, `depends_on`,
    `decision_id` … as `tool_call_propose` takes them)."""
    call, _ = tool_call_propose(
        tenant=run.tenant,
        run_id=run.pk,
        capability_id=capability,
        args=args,
        intent=intent,
        actor=actor,
        **fields,
    )
    return call


def fresh(call: ToolCall) -> ToolCall:
    return ToolCall.objects.get(pk=call.pk)


def consistency_window(monkeypatch: pytest.MonkeyPatch, capability_id: str, seconds: float):
    """From now on the look-ups of `capability_id` may lag `seconds` (0: the window has
    passed), so a test need not sleep through the real window."""
    capability = capabilities.get(capability_id)
    monkeypatch.setitem(
        capabilities.REGISTRY,
        capability_id,
        dataclasses.replace(capability, consistency_window=seconds),
    )


def open_the_circuit(run: Run, sandbox: Any, settings: Any, monkeypatch: Any) -> list[ToolCall]:
    """Four refunds meet a 5xx storm, sent three times each without backoff: the circuit of
    refund-order-v2 opens (for one second)."""
    settings.CIRCUIT_OPEN_SECONDS = 1.0
    monkeypatch.setattr(dispatch, "backoff", lambda policy, failures, retry_after: 0.0)
    sandbox.faults(system="payments", http_5xx=1.0)
    calls = [
        propose_in(run, {**REFUND, "amount_cents": 100 + i}, intent=f"i-{i}") for i in range(4)
    ]
    for _ in range(3):
        for call in calls:
            dispatch.tool_call_dispatch(tool_call_id=call.pk)
    return calls


# --- real processes -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def children_of(pid: int) -> list[int]:
    """Pids of the process's children (a Celery pool's processes, gunicorn's workers)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(child) for child in out.split()]


def nice_of_every_thread(pid: int) -> set[int]:
    """The nice value of each thread of the process (Linux keeps one per thread)."""
    values = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        values.add(int(stat[stat.rindex(")") + 2 :].split()[16]))  # field 19: nice
    return values


def autogroup_nice(pid: int) -> int | None:
    """The nice value of the process's session group ("/autogroup-25 nice 10"). None for a
    session without a group of its own: PID 1's, which no setsid made. Its processes, such as a
    CI runner's tests in a container, are in the root group, and the kernel prints nothing."""
    line = Path(f"/proc/{pid}/autogroup").read_text().split()
    return int(line[-1]) if line else None


def wait_for(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# As bin/test and .ci/run start it: on loopback, keeping nothing on disk.
REDIS_SERVER = ["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "--port", "6379"]
REDIS_SERVER += ["--save", "", "--appendonly", "no"]


# bin/test runs the suite in two processes (pytest-xdist), each with its own Redis database
# on the one server, and a second suite run on the same machine shares the server too. Every
# test holds this lock shared while it runs (tests/conftest.py); redis_down holds it alone, so
# that shutting the server down breaks no other test. flock: the kernel drops it if a process
# dies.
_redis_turn: IO[str] | None = None


@contextlib.contextmanager
def redis_shared(url: str) -> Iterator[None]:
    """Hold the Redis server's lock shared for the block (a test, in tests/conftest.py)."""
    global _redis_turn
    path = Path(tempfile.gettempdir()) / f"countersign-tests-redis-{urlsplit(url).port}.lock"
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        _redis_turn = lock
        try:
            yield
        finally:
            _redis_turn = None


@contextlib.contextmanager
def redis_down(url: str) -> Iterator[None]:
    """Shut the Redis server at `url` down (keeping nothing, as it is run here), then start it
    again the way bin/test and .ci/run do. Waits until no other test is running first."""
    assert _redis_turn is not None, "redis_down runs inside a test (tests/conftest.py)"
    # flock turns the shared lock into the exclusive one by dropping it first, so two tests
    # that both wait here do not wait for each other.
    fcntl.flock(_redis_turn, fcntl.LOCK_EX)
    server = redis.Redis.from_url(url)
    with contextlib.suppress(redis.exceptions.ConnectionError):
        server.shutdown(nosave=True)  # it closes the connection as it goes
    try:
        yield
    finally:
        subprocess.run(REDIS_SERVER, check=True)
        wait_for(lambda: _pings(server), 10, "Redis to start again")
        fcntl.flock(_redis_turn, fcntl.LOCK_SH)


def _pings(server: redis.Redis) -> bool:
    try:
        return bool(server.ping())
    except redis.exceptions.ConnectionError:
        return False


def popen_as_from_a_terminal(argv: list[str], **kwargs: Any) -> subprocess.Popen:
    """subprocess.Popen with SIGINT at its default in the child, as a terminal starts a
    program, so that the test's SIGINT is a person's Ctrl-C. A suite started with SIGINT
    ignored (a script's background job: a shell without job control starts `bin/test &` so)
    would pass that on: an ignored signal stays ignored across exec, and the child would never
    see it. A caught one is reset to its default there, so catching it for the fork is enough."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(argv, **kwargs)
    finally:
        signal.signal(signal.SIGINT, previous)


def embedded_env(var_dir: Path) -> dict[str, str]:
    """The environment of a bare machine: no database or broker configured."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE"}
    }
    env["COUNTERSIGN_VAR_DIR"] = str(var_dir)
    # The client package of this checkout, as pytest's own `pythonpath` has it.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "client"), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


# --- a webhook receiver ---------------------------------------------------------------------


@dataclasses.dataclass
class Received:
    headers: dict[str, str]
    body: bytes


class WebhookReceiver:
    """A real HTTP server on 127.0.0.1, in a thread: it keeps every POST and answers each with
    the next status of `answers` (200 once they are used up)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.answers: list[int] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.received.append(Received(dict(self.headers.items()), body))
                status = receiver.answers.pop(0) if receiver.answers else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/countersign"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> WebhookReceiver:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(r.body) for r in self.received]


T = TypeVar("T")


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine in a thread of its own: the browser tests' Playwright keeps an event
    loop running in the test thread, where asyncio.run() refuses to start another, and the
    test's thread keeps the ORM synchronous."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
