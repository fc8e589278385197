"""`countersign-mcp`: an MCP server that hands a model's side effects to Countersign.

    COUNTERSIGN_URL=http://127.0.0.1:8000 COUNTERSIGN_API_KEY=cs_… countersign-mcp
    countersign-mcp --transport http --port 8765        # Streamable HTTP at /mcp

One tool per capability the API key may propose (GET /api/v1/capabilities: its input schema
and annotations from its contract), plus `countersign_status`, `countersign_cancel` and
`countersign_pending`. A call is proposed in the server's run, then followed for up to
`--wait` seconds with a progress notification every few; the answer is the outcome or a
pending handle. Countersign executes; the host only waits. The server is the agent's side:
it speaks to Countersign only through the client package, over HTTP.

An elicitation is never an approval: a host that supports URL elicitation is shown the
approval page, and whatever it answers, the call still waits for an approver there.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import mcp.types as types
from mcp.server import Server, ServerRequestContext

from countersign import mcp_outcome
from countersign.aio import AsyncCountersign
from countersign.client import CountersignError
from countersign.types import TERMINAL, ToolCall

log = logging.getLogger("countersign.mcp")

# The longest a status check holds the host's request: many hosts time a request out at
# 60 s, and a pending handle is a fine answer to come back to.
MAX_STATUS_WAIT_S = 50


@dataclass
class Settings:
    url: str
    api_key: str
    run_id: str = ""
    # The host's conversation id: the same run every time the server starts with it.
    external_ref: str = ""
    title: str = "MCP session"
    wait_s: float = 20.0
    progress_every_s: float = 3.0
    elicit_approval_url: bool = True


@dataclass
class Bridge:
    """The server's state: the client and the run its calls are proposed in."""

    settings: Settings
    cs: AsyncCountersign
    _run_id: str = ""
    _run_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def run_id(self) -> str:
        async with self._run_lock:
            if not self._run_id:
                self._run_id = await self._resolve_run()
            return self._run_id

    async def _resolve_run(self) -> str:
        s = self.settings
        if s.run_id:
            return (await self.cs.get_run(s.run_id))["run_id"]
        # Without a ref of the host's, one run per server process; starting it again with the
        # same ref (a retry after a lost answer) is the same run.
        ref = s.external_ref or f"mcp:{uuid.uuid4().hex}"
        return (await self.cs.start_run(s.title, external_ref=ref))["run_id"]

    async def list_tools(self) -> list[types.Tool]:
        listed = await self.cs.capabilities()
        tools = [_capability_tool(c) for c in listed if c.get("may_propose")]
        return [*tools, *_builtin_tools(self.settings.wait_s)]

    async def follow(self, ctx: ServerRequestContext, call: ToolCall, wait_s: float) -> ToolCall:
        """Long-poll `call` until it settles or `wait_s` pass, telling the host how it
        stands every `progress_every_s` seconds (a no-op when the host asked for none)."""
        started = time.monotonic()
        deadline = started + wait_s
        every = self.settings.progress_every_s
        while call["status"] not in TERMINAL:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await ctx.session.report_progress(
                round(time.monotonic() - started, 3), wait_s, mcp_outcome.waiting_message(call)
            )
            try:
                call = await self.cs.tool_call(
                    call["tool_call_id"], wait=min(every, left), since=call["updated_at"]
                )
            except (CountersignError, httpx.TransportError) as exc:
                # The call is recorded either way: answer with what was last seen (a pending
                # handle), never with an error that invites the model to propose it again.
                log.warning("following %s: %s", call["tool_call_id"], exc)
                break
        return call

    async def propose(
        self, ctx: ServerRequestContext, tool: str, args: dict[str, Any], meta: dict[str, Any]
    ) -> types.CallToolResult:
        run_id = await self.run_id()
        intent = mcp_outcome.intent_for(meta, run_id, tool, args)
        try:
            call = await self.cs.propose(run_id, tool, args, intent=intent)
        except CountersignError as refused:
            return refusal(refused)
        async with anyio.create_task_group() as tasks:
            if call["status"] == "awaiting_approval" and self._may_elicit(ctx):
                tasks.start_soon(point_to_approval_page, ctx, call)
            call = await self.follow(ctx, call, self.settings.wait_s)
            # An elicitation still open is moot: the answer never decided anything.
            tasks.cancel_scope.cancel()
        return answer(call)

    def _may_elicit(self, ctx: ServerRequestContext) -> bool:
        capabilities = ctx.session.client_capabilities
        return bool(
            self.settings.elicit_approval_url
            and ctx.session.can_send_request
            and capabilities
            and capabilities.elicitation
            and capabilities.elicitation.url
        )

    async def status(self, ctx: ServerRequestContext, args: dict[str, Any]) -> types.CallToolResult:
        wait_s = float(args.get("wait_s", self.settings.wait_s))
        call = await self.cs.tool_call(args["call_id"])
        return answer(await self.follow(ctx, call, min(max(0.0, wait_s), MAX_STATUS_WAIT_S)))

    async def cancel(self, args: dict[str, Any]) -> types.CallToolResult:
        call = await self.cs.cancel(args["call_id"], reason=args.get("reason", ""))
        return answer(call)

    async def pending(self) -> types.CallToolResult:
        progress = await self.cs.progress(await self.run_id())
        items = [
            {k: item[k] for k in ("tool_call_id", "capability", "summary", "kind")}
            for item in progress["open"]
        ]
        lines = [
            f"- {i['tool_call_id']} {i['capability']}: {i['kind']} ({i['summary']})" for i in items
        ]
        text = (
            "Calls still open in this run (do not issue them again; follow them with "
            "countersign_status):\n" + "\n".join(lines)
            if items
            else "No call of this run is open."
        )
        return types.CallToolResult(
            content=[types.TextContent(text=text)],
            structured_content={"run_id": progress["run_id"], "open": items},
        )


async def point_to_approval_page(ctx: ServerRequestContext, call: ToolCall) -> None:
    """Show the host the approval page. Its answer is only logged: accepting the dialog is
    not an approval — an approver decides on that page, in Countersign, as a person."""
    try:
        result = await ctx.session.elicit_url(
            message=(
                f"{call['capability']} waits for an approver. The decision is made on "
                "Countersign's approval page, not here."
            ),
            url=call["approval_url"],
            elicitation_id=call["tool_call_id"],
            related_request_id=ctx.request_id,
        )
    except Exception as exc:  # a host without the dialog: the call waits all the same
        log.info("elicitation for %s not shown: %s", call["tool_call_id"], exc)
        return
    log.info("elicitation for %s answered %s; not an approval", call["tool_call_id"], result.action)


def answer(call: ToolCall) -> types.CallToolResult:
    text, is_error = mcp_outcome.outcome_text(call)
    return types.CallToolResult(
        content=[types.TextContent(text=text)],
        structured_content=mcp_outcome.handle(call),
        is_error=is_error,
    )


def refusal(refused: CountersignError) -> types.CallToolResult:
    """A proposal Countersign refused (bad arguments, a scope, a conflict): nothing was
    written; the model may correct the arguments and call again."""
    details = f" Details: {mcp_outcome.canonical_json(refused.details)}" if refused.details else ""
    return types.CallToolResult(
        content=[types.TextContent(text=f"Refused ({refused.name}): {refused.message}{details}")],
        structured_content={"error": refused.name, "message": refused.message},
        is_error=True,
    )


def _capability_tool(capability: dict[str, Any]) -> types.Tool:
    return types.Tool(
        name=capability["id"],
        title=capability["title"],
        description=mcp_outcome.describe(capability),
        input_schema=capability["input_schema"],
        annotations=types.ToolAnnotations(**mcp_outcome.annotations_of(capability)),
    )


def _builtin_tools(wait_s: float) -> list[types.Tool]:
    call_id = {"type": "string", "description": "The call_id of an earlier answer."}
    return [
        types.Tool(
            name="countersign_status",
            description=(
                "How a call stands: its result, why it was refused, or that it still waits. "
                f"Waits up to wait_s seconds (default {wait_s:g}, at most "
                f"{MAX_STATUS_WAIT_S}) for it to settle."
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "call_id": call_id,
                    "wait_s": {"type": "number", "minimum": 0, "maximum": MAX_STATUS_WAIT_S},
                },
                "required": ["call_id"],
                "additionalProperties": False,
            },
            annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
        ),
        types.Tool(
            name="countersign_cancel",
            description=(
                "Withdraw a call that has not been sent yet (waiting for approval, or "
                "authorized). A call already sent cannot be cancelled; its outcome is recorded."
            ),
            input_schema={
                "type": "object",
                "properties": {"call_id": call_id, "reason": {"type": "string"}},
                "required": ["call_id"],
                "additionalProperties": False,
            },
            annotations=types.ToolAnnotations(
                read_only_hint=False,
                destructive_hint=True,
                idempotent_hint=True,
                open_world_hint=False,
            ),
        ),
        types.Tool(
            name="countersign_pending",
            description="The calls of this session that are still open, and what each waits for.",
            input_schema={"type": "object", "properties": {}, "additionalProperties": False},
            annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
        ),
    ]


# --- the MCP server ---------------------------------------------------------------------------


def build_server(bridge: Bridge) -> Server:
    async def on_list_tools(
        ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=await bridge.list_tools())

    async def on_call_tool(
        ctx: ServerRequestContext, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        args = params.arguments or {}
        try:
            if params.name == "countersign_status":
                return await bridge.status(ctx, args)
            if params.name == "countersign_cancel":
                return await bridge.cancel(args)
            if params.name == "countersign_pending":
                return await bridge.pending()
            return await bridge.propose(ctx, params.name, args, dict(params.meta or {}))
        except CountersignError as refused:
            return refusal(refused)

    return Server(
        "countersign",
        version="0.2.0",
        instructions=(
            "Side effects run through Countersign: exactly once, with human approval where "
            "policy asks. Never call a tool again for something still pending; check it with "
            "countersign_status. An outcome marked unknown is being reconciled: do not retry."
        ),
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
    )


# --- the command ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="countersign-mcp", description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=env("COUNTERSIGN_URL", "http://127.0.0.1:8000"))
    parser.add_argument(
        "--api-key",
        default=env("COUNTERSIGN_API_KEY", ""),
        help="prefer the COUNTERSIGN_API_KEY variable: flags show in the process list",
    )
    parser.add_argument("--run-id", default=env("COUNTERSIGN_RUN_ID", ""))
    parser.add_argument("--external-ref", default=env("COUNTERSIGN_EXTERNAL_REF", ""))
    parser.add_argument("--title", default=env("COUNTERSIGN_RUN_TITLE", "MCP session"))
    parser.add_argument(
        "--wait",
        type=float,
        default=float(env("COUNTERSIGN_MCP_WAIT_S", "20")),
        help="seconds a tool call waits for its outcome before answering with a pending handle",
    )
    parser.add_argument(
        "--progress-every", type=float, default=float(env("COUNTERSIGN_MCP_PROGRESS_S", "3"))
    )
    parser.add_argument(
        "--no-elicit",
        action="store_true",
        default=env("COUNTERSIGN_MCP_ELICIT", "1") == "0",
        help="never show the host the approval page through URL elicitation",
    )
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--path", default="/mcp")
    options = parser.parse_args(argv)
    if not options.api_key:
        parser.error("set COUNTERSIGN_API_KEY (an API key of your tenant)")
    return options


async def serve(options: argparse.Namespace) -> None:
    settings = Settings(
        url=options.url,
        api_key=options.api_key,
        run_id=options.run_id,
        external_ref=options.external_ref,
        title=options.title,
        wait_s=options.wait,
        progress_every_s=options.progress_every,
        elicit_approval_url=not options.no_elicit,
    )
    async with AsyncCountersign(settings.url, settings.api_key) as cs:
        server = build_server(Bridge(settings, cs))
        if options.transport == "stdio":
            from mcp.server.stdio import stdio_server

            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
            return
        import uvicorn

        app = server.streamable_http_app(streamable_http_path=options.path, host=options.host)
        config = uvicorn.Config(app, host=options.host, port=options.port, log_level="warning")
        log.info("countersign-mcp on http://%s:%s%s", options.host, options.port, options.path)
        await uvicorn.Server(config).serve()


def main(argv: list[str] | None = None) -> None:
    # stdout is the protocol's wire on stdio: everything else goes to stderr.
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s: %(message)s")
    anyio.run(serve, parse_args(argv))


if __name__ == "__main__":
    main()
