"""The client package (`countersign`) against a live Countersign: pytest-django's live server
on PostgreSQL, the sandbox over HTTP, the outbox's tasks run in a thread of the test."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from countersign import AsyncCountersign, Countersign, CountersignError
from django.db import connections

from runs.models import Decision, Run, User
from tests.helpers import BIG_REFUND, REFUND, ApiClient, approval_of, decide, logged_in, run_async
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due

pytestmark = pytest.mark.django_db(transaction=True)




@pytest.fixture
def cs(live_server, agent: ApiClient, sandbox: Sandbox) -> Iterator[Countersign]:
    client = Countersign(live_server.url, agent.token)
    yield client
    client.close()


def in_a_while(work) -> threading.Thread:
    """Do `work` in another thread a moment from now (as a person or a worker would), with
    its own database connection."""

    def run() -> None:
        try:
            threading.Event().wait(0.5)
            work()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


# --- a proxy that loses an answer -------------------------------------------------------------


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class LosingProxy:
    """A TCP proxy in front of the live server. It passes each request on; for the first
    `lose` of them it drops the answer and closes the connection, as a network that fails
    after the request arrived would."""

    upstream: tuple[str, int]
    lose: int = 1
    seen: list[Seen] = field(default_factory=list)

    def start(self) -> LosingProxy:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self.serve, daemon=True).start()
        return self

    def stop(self) -> None:
        self.listener.close()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.relay, args=(conn,), daemon=True).start()

    def relay(self, conn: socket.socket) -> None:
        with conn:
            request = self.read_request(conn)
            if request is None:
                return
            with socket.create_connection(self.upstream) as upstream:
                upstream.sendall(request)
                answer = b"".join(iter(lambda: upstream.recv(65536), b""))
            if self.lose > 0:
                self.lose -= 1
                return  # the answer is lost; the client sees the connection close
            head, _, body = answer.partition(b"\r\n\r\n")
            lines = [h for h in head.split(b"\r\n") if not h.lower().startswith(b"connection:")]
            conn.sendall(b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body)

    def read_request(self, conn: socket.socket) -> bytes | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in header_lines)
        length = int(next((v for k, v in headers.items() if k.lower() == "content-length"), 0))
        while len(body) < length:
            body += conn.recv(65536)
        method, path, _ = request_line.split(" ", 2)
        self.seen.append(Seen(method, path, {k.lower(): v for k, v in headers.items()}))
        kept = [line for line in header_lines if not line.lower().startswith("connection:")]
        head = "\r\n".join([request_line, *kept, "Connection: close"])
        return head.encode("latin-1") + b"\r\n\r\n" + body


@pytest.fixture
def proxy(live_server) -> Iterator[LosingProxy]:
    host, port = live_server.url.removeprefix("http://").split(":")
    proxy = LosingProxy((host, int(port))).start()
    yield proxy
    proxy.stop()


# --- runs -------------------------------------------------------------------------------------


def test_a_run_started_again_with_its_external_ref_is_the_same_run(cs: Countersign) -> None:
    first = cs.start_run("Refund order-002", external_ref="thread-42")
    again = cs.start_run("Refund order-002", external_ref="thread-42")
    assert again["run_id"] == first["run_id"]
    assert again["external_ref"] == "thread-42"
    with pytest.raises(CountersignError) as refused:
        cs.start_run("Something else", external_ref="thread-42")
    assert (refused.value.status, refused.value.name) == (409, "idempotency.conflict")


def test_a_retry_after_a_lost_answer_sends_the_same_idempotency_key(
    proxy: LosingProxy, agent: ApiClient, sandbox: Sandbox
) -> None:
    with Countersign(proxy.url, agent.token) as cs:
        run = cs.start_run("Refund order-002")  # no key given: the client makes one
    first, retry = proxy.seen
    assert (first.method, first.path) == ("POST", "/api/v1/runs")
    assert retry.headers["idempotency-key"] == first.headers["idempotency-key"]
    # The first request created the run; the retry found it instead of starting another.
    assert list(Run.objects.values_list("pk", flat=True)) == [run["run_id"]]


def test_the_async_client_retries_with_the_same_key_too(
    proxy: LosingProxy, agent: ApiClient, sandbox: Sandbox
) -> None:
    async def start() -> dict:
        async with AsyncCountersign(proxy.url, agent.token) as cs:
            return await cs.start_run("Refund order-002")

    run = run_async(start())
    first, retry = proxy.seen
    assert retry.headers["idempotency-key"] == first.headers["idempotency-key"]
    assert list(Run.objects.values_list("pk", flat=True)) == [run["run_id"]]


def test_a_request_the_server_does_not_deduplicate_is_not_sent_twice(
    proxy: LosingProxy, cs: Countersign, agent: ApiClient
) -> None:
    run = cs.start_run("Refund order-002")
    with Countersign(proxy.url, agent.token) as through, pytest.raises(httpx.RemoteProtocolError):
        through.record_decision(run["run_id"], "refund_eligibility", {"ok": True})
    assert len(proxy.seen) == 1
    assert Decision.objects.count() == 1  # it arrived once; the client did not repeat it


# --- tool calls -------------------------------------------------------------------------------


def test_it_proposes_and_waits_for_the_verified_outcome(cs: Countersign) -> None:
    run = cs.start_run("Refund order-002", external_ref="thread-1")
    call = cs.propose(run["run_id"], "refund-order-v2", REFUND, intent="call_abc123")
    assert call["status"] == "running"
    again = cs.propose(run["run_id"], "refund-order-v2", REFUND, intent="call_abc123")
    assert again["tool_call_id"] == call["tool_call_id"]
    worker = in_a_while(run_due)
    done = cs.wait(call["tool_call_id"], timeout=30)
    worker.join()
    assert done["status"] == "succeeded"
    assert done["result"]["amount_cents"] == 2500


def test_an_approvers_edit_reaches_the_agent(
    cs: Countersign, approver: User, sandbox: Sandbox
) -> None:
    evaluation = cs.evaluate_policy("refund-order-v2", BIG_REFUND)
    assert (evaluation["needs_approval"], evaluation["required_approvers"]) == (True, 1)
    run = cs.start_run("Refund order-003")
    call = cs.propose(run["run_id"], "refund-order-v2", BIG_REFUND, intent="call_big")
    assert call["status"] == "awaiting_approval"
    assert call["approval_url"].endswith(f"/approvals/{call['approval']['approval_id']}/")

    def approve_with_an_edit() -> None:
        approval = approval_of(call)
        decide(logged_in(approver), approval, "edit", edit__amount_cents="15000", reason="half")
        run_due()

    person = in_a_while(approve_with_an_edit)
    done = cs.wait(call["tool_call_id"], timeout=30)
    person.join()
    assert done["status"] == "succeeded"
    assert done["edited"] is True
    assert done["executed_args"]["amount_cents"] == 15000
    assert (done["decision"]["outcome"], done["decision"]["by"]) == ("approved", ["alice"])
    assert len(sandbox.ledger("payments")) == 1


def test_wait_returns_the_call_as_it_is_when_the_time_is_up(cs: Countersign) -> None:
    run = cs.start_run("Refund order-003")
    call = cs.propose(run["run_id"], "refund-order-v2", BIG_REFUND, intent="call_big")
    assert cs.wait(call["tool_call_id"], timeout=0.5)["status"] == "awaiting_approval"


def test_it_cancels_before_dispatch_and_says_why_not_after(cs: Countersign) -> None:
    run = cs.start_run("Refund order-003")
    held = cs.propose(run["run_id"], "refund-order-v2", BIG_REFUND, intent="call_big")
    assert cs.cancel(held["tool_call_id"], reason="withdrawn")["status"] == "cancelled"
    sent = cs.propose(run["run_id"], "refund-order-v2", REFUND, intent="call_small")
    run_due()
    with pytest.raises(CountersignError) as refused:
        cs.cancel(sent["tool_call_id"])
    assert (refused.value.status, refused.value.name) == (409, "tool_call.already_dispatched")
    assert refused.value.details == [{"execution_status": "completed", "status": "succeeded"}]


def test_the_async_client_does_the_common_path(live_server, agent: ApiClient, sandbox) -> None:
    async def common_path() -> tuple[dict, dict]:
        async with AsyncCountersign(live_server.url, agent.token) as cs:
            evaluation = await cs.evaluate_policy("refund-order-v2", REFUND)
            run = await cs.start_run("Refund order-002", external_ref="thread-async")
            call = await cs.propose(run["run_id"], "refund-order-v2", REFUND, intent="call_1")
            worker = in_a_while(run_due)
            done = await cs.wait(call["tool_call_id"], timeout=30)
            await asyncio.to_thread(worker.join)
            return evaluation, done

    evaluation, done = run_async(common_path())
    assert evaluation["needs_approval"] is False
    assert done["status"] == "succeeded"


def test_an_api_error_is_named(cs: Countersign) -> None:
    with pytest.raises(CountersignError) as refused:
        cs.get_run("run_missing")
    assert (refused.value.status, refused.value.name) == (404, "resource.not_found")


def test_a_minted_credential_acts_on_its_run_only(live_server, cs: Countersign) -> None:
    mine, other = cs.start_run("mine"), cs.start_run("other")
    credential = cs.mint_credential(mine["run_id"], ttl_s=120, scopes=["payments.refund"])
    assert credential["scopes"] == ["payments.refund"]
    with Countersign(live_server.url, credential["token"]) as worker:
        assert worker.get_run(mine["run_id"])["title"] == "mine"
        with pytest.raises(CountersignError) as refused:
            worker.get_run(other["run_id"])
        assert (refused.value.status, refused.value.name) == (403, "auth.credential_run_bound")
        cs.finish_run(mine["run_id"])
        with pytest.raises(CountersignError) as ended:
            worker.get_run(mine["run_id"])
        assert (ended.value.status, ended.value.name) == (401, "auth.credential_revoked")


def test_the_async_client_mints_a_credential(live_server, agent: ApiClient, sandbox) -> None:
    async def mint() -> dict:
        async with AsyncCountersign(live_server.url, agent.token) as cs:
            run = await cs.start_run("async credential")
            return await cs.mint_credential(run["run_id"], ttl_s=60)

    credential = run_async(mint())
    assert credential["token"].startswith(credential["credential_id"] + ".")
