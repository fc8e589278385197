"""The MCP server (`python -m countersign.mcp_server`, the `countersign-mcp` command) as a
host uses it: the SDK's own `ClientSession` talks to the server process over stdio and over
Streamable HTTP, against a live Countersign — pytest-django's live server on PostgreSQL, a
real Celery worker process, the sandbox over HTTP. An approver decides through the console's
endpoint (the Django test client posting the approval page's form)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import mcp.types as types
import pytest
from django.db import connections
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from approvals.models import Approval
from runs.models import User
from tests.helpers import (
    BIG_REFUND,
    ROOT,
    ApiClient,
    decide,
    free_port,
    logged_in,
    run_async,
    wait_for,
)
from tests.sandbox_process import Sandbox
from toolcalls.models import ToolCall

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

REFUND_TOOL = "refund-order-v2"


def server_env(live_server, agent: ApiClient) -> dict[str, str]:
    return {
        **os.environ,
        "COUNTERSIGN_URL": live_server.url,
        "COUNTERSIGN_API_KEY": agent.token,
        # This checkout's client package, ahead of the virtualenv's copy.
        "PYTHONPATH": str(ROOT / "client"),
    }


def stdio_server(live_server, agent: ApiClient, *args: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "countersign.mcp_server", *args],
        env=server_env(live_server, agent),
        cwd=str(ROOT),
    )


@asynccontextmanager
async def stdio_session(params: StdioServerParameters, **callbacks: Any):
    with Path(os.devnull).open("w") as quiet:
        async with (
            stdio_client(params, errlog=quiet) as (read, write),
            ClientSession(read, write, **callbacks) as session,
        ):
            await session.initialize()
            yield session


@pytest.fixture
def http_server(live_server, agent: ApiClient, tmp_path: Path) -> Iterator[str]:
    """The server over Streamable HTTP, in a process of its own; yields its URL."""
    port = free_port()
    log = (tmp_path / "mcp-http.log").open("w")
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "countersign.mcp_server", "--transport", "http"),
            *("--port", str(port), "--wait", "30", "--progress-every", "1"),
        ],
        env=server_env(live_server, agent),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/mcp"

    def listening() -> bool:
        try:
            httpx.get(url, timeout=1)
        except httpx.TransportError:
            return False
        return True

    try:
        wait_for(listening, 30, "the MCP server to listen")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


@asynccontextmanager
async def http_session(url: str) -> AsyncIterator[ClientSession]:
    async with (
        streamable_http_client(url) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


class Progress:
    """The progress notifications a tool call sent."""

    def __init__(self) -> None:
        self.messages: list[str | None] = []

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.messages.append(message)


def approve_with_an_edit_when_asked(approver: User, amount_cents: int) -> threading.Thread:
    """In another thread, as a person would: wait for the approval to open, then approve it
    with an edit through the console's endpoint."""

    def work() -> None:
        try:
            wait_for(
                lambda: Approval.objects.filter(state=Approval.State.PENDING).exists(),
                30,
                "an approval to open",
            )
            approval = Approval.objects.get(state=Approval.State.PENDING)
            answer = decide(
                logged_in(approver),
                approval,
                "edit",
                edit__amount_cents=str(amount_cents),
                reason="half now, half after the return",
            )
            assert answer.status_code in (200, 302), answer.status_code
        finally:
            connections.close_all()

    thread = threading.Thread(target=work)
    thread.start()
    return thread


def assert_one_refund_of(sandbox: Sandbox, amount_cents: int) -> None:
    refunds = sandbox.ledger("payments")
    assert len(refunds) == 1, refunds
    call = ToolCall.objects.get()
    assert len(sandbox.effects_for(call.external_request_id)) == 1
    assert call.args["amount_cents"] == amount_cents


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


# --- stdio --------------------------------------------------------------------------------------


def test_over_stdio_a_big_refund_parks_and_the_status_returns_the_edited_result(
    live_server, agent: ApiClient, approver: User, sandbox: Sandbox, start_celery
) -> None:
    start_celery("worker")
    params = stdio_server(live_server, agent, "--wait", "2", "--progress-every", "1")

    async def host() -> tuple[Any, ...]:
        async with stdio_session(params) as session:
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            progress = Progress()
            parked = await session.call_tool(REFUND_TOOL, BIG_REFUND, progress_callback=progress)
            again = await session.call_tool(REFUND_TOOL, BIG_REFUND)
            person = approve_with_an_edit_when_asked(approver, 15000)
            call_id = parked.structured_content["call_id"]
            done = await session.call_tool("countersign_status", {"call_id": call_id, "wait_s": 45})
            await asyncio.to_thread(person.join)
            return tools, parked, again, done, progress

    tools, parked, again, done, progress = run_async(host())

    refund = tools[REFUND_TOOL]
    assert refund.input_schema["required"] == ["order_id", "amount_cents", "currency"]
    assert refund.annotations.destructive_hint is True
    assert refund.annotations.read_only_hint is False
    assert tools["get-order-v1"].annotations.read_only_hint is True
    assert {"countersign_status", "countersign_cancel", "countersign_pending"} <= set(tools)

    assert parked.is_error is False
    assert parked.structured_content["status"] == "awaiting_approval"
    assert "Do not re-issue this call" in text_of(parked)
    assert "waiting for approval, 0 of 1" in progress.messages
    # The model asking again for the same refund gets the same call, not a second one.
    assert again.structured_content["call_id"] == parked.structured_content["call_id"]

    assert done.is_error is False
    assert done.structured_content["status"] == "succeeded"
    assert done.structured_content["edited"] is True
    assert done.structured_content["executed_args"]["amount_cents"] == 15000
    assert done.structured_content["result"]["amount_cents"] == 15000
    assert "what actually ran" in text_of(done)
    assert_one_refund_of(sandbox, 15000)


def test_a_server_started_again_for_the_same_conversation_gives_the_same_call(
    live_server, agent: ApiClient, approver: User, sandbox: Sandbox, start_celery
) -> None:
    """The host's conversation id (COUNTERSIGN_EXTERNAL_REF) names the run: a server process
    that ends after proposing, and a new one the host starts, propose into the same run, so
    the model asking again for the same refund gets the same call — one refund."""
    start_celery("worker")
    params = stdio_server(live_server, agent, "--wait", "0")
    params.env["COUNTERSIGN_EXTERNAL_REF"] = "conversation-7"

    async def host() -> tuple[Any, ...]:
        async with stdio_session(params) as session:
            before = await session.call_tool(REFUND_TOOL, BIG_REFUND)
        person = approve_with_an_edit_when_asked(approver, 20000)
        async with stdio_session(params) as session:
            after = await session.call_tool(REFUND_TOOL, BIG_REFUND)
            call_id = after.structured_content["call_id"]
            done = await session.call_tool("countersign_status", {"call_id": call_id, "wait_s": 45})
        await asyncio.to_thread(person.join)
        return before, after, done

    before, after, done = run_async(host())
    assert after.structured_content["call_id"] == before.structured_content["call_id"]
    assert done.structured_content["status"] == "succeeded"
    assert done.structured_content["executed_args"]["amount_cents"] == 20000
    assert_one_refund_of(sandbox, 20000)


def test_a_key_from_the_hosts_meta_is_the_intent(
    live_server, agent: ApiClient, sandbox: Sandbox
) -> None:
    params = stdio_server(live_server, agent, "--wait", "0")
    meta = {"io.countersign/idempotency-key": "toolu_01XYZ"}

    async def host() -> types.CallToolResult:
        async with stdio_session(params) as session:
            return await session.call_tool(REFUND_TOOL, BIG_REFUND, meta=meta)

    answer = run_async(host())
    assert ToolCall.objects.get(pk=answer.structured_content["call_id"]).intent == "toolu_01XYZ"


def test_an_elicitation_answer_is_never_an_approval(
    live_server, agent: ApiClient, sandbox: Sandbox
) -> None:
    asked: list[types.ElicitRequestParams] = []

    async def says_yes(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="accept", content={"approved": True})

    params = stdio_server(live_server, agent, "--wait", "3")

    async def host() -> types.CallToolResult:
        async with stdio_session(params, elicitation_callback=says_yes) as session:
            return await session.call_tool(REFUND_TOOL, BIG_REFUND)

    answer = run_async(host())
    assert answer.structured_content["status"] == "awaiting_approval"
    # The host was shown the approval page, and at most that.
    assert [p.url for p in asked] == [answer.structured_content["approval_url"]]
    approval = Approval.objects.get()
    assert approval.state == Approval.State.PENDING
    assert ToolCall.objects.get().execution_status == "awaiting_approval"
    assert sandbox.ledger("payments") == []


def test_a_pending_call_can_be_cancelled_and_listed(
    live_server, agent: ApiClient, sandbox: Sandbox
) -> None:
    params = stdio_server(live_server, agent, "--wait", "0")

    async def host() -> tuple[types.CallToolResult, ...]:
        async with stdio_session(params) as session:
            parked = await session.call_tool(REFUND_TOOL, BIG_REFUND)
            listed = await session.call_tool("countersign_pending", {})
            call_id = parked.structured_content["call_id"]
            cancelled = await session.call_tool("countersign_cancel", {"call_id": call_id})
            after = await session.call_tool("countersign_pending", {})
            return parked, listed, cancelled, after

    parked, listed, cancelled, after = run_async(host())
    call_id = parked.structured_content["call_id"]
    assert [item["tool_call_id"] for item in listed.structured_content["open"]] == [call_id]
    assert cancelled.structured_content["status"] == "cancelled"
    assert cancelled.is_error is True
    assert after.structured_content["open"] == []


def test_a_refused_proposal_names_the_error(
    live_server, agent: ApiClient, sandbox: Sandbox
) -> None:
    params = stdio_server(live_server, agent, "--wait", "0")

    async def host() -> types.CallToolResult:
        async with stdio_session(params) as session:
            return await session.call_tool(REFUND_TOOL, {**BIG_REFUND, "amount_cents": "lots"})

    answer = run_async(host())
    assert answer.is_error is True
    assert text_of(answer).startswith("Refused (tool.validation_failed)")
    assert ToolCall.objects.count() == 0


# --- Streamable HTTP ------------------------------------------------------------------------


def test_over_http_a_big_refund_waits_for_the_approver_and_returns_the_edited_result(
    http_server: str, approver: User, sandbox: Sandbox, start_celery
) -> None:
    start_celery("worker")

    async def host() -> tuple[types.CallToolResult, Progress]:
        async with http_session(http_server) as session:
            progress = Progress()
            person = approve_with_an_edit_when_asked(approver, 12000)
            done = await session.call_tool(REFUND_TOOL, BIG_REFUND, progress_callback=progress)
            await asyncio.to_thread(person.join)
            return done, progress

    done, progress = run_async(host())
    assert "waiting for approval, 0 of 1" in progress.messages
    assert done.is_error is False, text_of(done)
    assert done.structured_content["status"] == "succeeded"
    assert done.structured_content["edited"] is True
    assert done.structured_content["executed_args"]["amount_cents"] == 12000
    assert done.structured_content["decision"]["by"] == ["alice"]
    assert_one_refund_of(sandbox, 12000)


# --- the example --------------------------------------------------------------------------------


def test_the_example_host_runs(live_server, agent: ApiClient, sandbox: Sandbox) -> None:
    done = subprocess.run(
        [sys.executable, "examples/mcp_host.py", "--wait", "1", "--follow", "0"],
        cwd=ROOT,
        env=server_env(live_server, agent),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "tool refund-order-v2: destructive" in done.stdout
    assert "waiting for approval, 0 of 1" in done.stdout
    assert "Do not re-issue this call" in done.stdout
