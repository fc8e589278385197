"""A minimal MCP host: it starts `countersign-mcp` over stdio with the MCP SDK's own client,
lists the tools, and asks for a refund over the approval threshold — what a model in Claude
Desktop, an IDE or any MCP host does when it calls the tool. No LLM: the calls are scripted.

    COUNTERSIGN_URL=http://127.0.0.1:8000 COUNTERSIGN_API_KEY=cs_… \\
        python examples/mcp_host.py [--order order-003 --amount-cents 25000] [--follow 300]

The refund waits for an approver: open the approval URL it prints, log in (bin/demo prints
the logins) and approve, reject or approve with an edit. The host follows the call with
`countersign_status` and prints what actually ran. A host application is configured the same
way: examples/mcp_host.json is the `mcpServers` entry (command and environment).

Needs the client package with its `mcp` extra: `pip install "./client[mcp]"`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


async def on_progress(progress: float, total: float | None, message: str | None) -> None:
    print(f"  … {message} ({progress:.0f} s)")


def show(answer: Any) -> dict[str, Any]:
    for block in answer.content:
        print(block.text)
    return answer.structured_content or {}


async def host(options: argparse.Namespace) -> None:
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "countersign.mcp_server", "--wait", str(options.wait)],
        env={k: v for k, v in os.environ.items() if k.startswith(("COUNTERSIGN_", "PYTHON"))},
    )
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for tool in (await session.list_tools()).tools:
            hints = tool.annotations
            kind = (
                "read-only"
                if hints.read_only_hint
                else "destructive"
                if hints.destructive_hint
                else "write"
            )
            print(f"tool {tool.name}: {kind}")
        args = {
            "order_id": options.order,
            "amount_cents": options.amount_cents,
            "currency": "USD",
            "reason": "duplicate charge",
        }
        print(f"\ncalling refund-order-v2 {args}")
        call = show(await session.call_tool("refund-order-v2", args, progress_callback=on_progress))
        deadline = time.monotonic() + options.follow
        while call.get("status") in ("awaiting_approval", "running", "unknown"):
            if time.monotonic() >= deadline:
                break
            print("\nchecking with countersign_status")
            status = {"call_id": call["call_id"], "wait_s": 20}
            answer = await session.call_tool(
                "countersign_status", status, progress_callback=on_progress
            )
            call = show(answer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--order", default="order-003")
    parser.add_argument("--amount-cents", type=int, default=25000)
    parser.add_argument("--wait", type=float, default=20, help="the server's wait per call")
    parser.add_argument("--follow", type=float, default=300, help="seconds to keep checking")
    if not os.environ.get("COUNTERSIGN_API_KEY"):
        parser.error("set COUNTERSIGN_API_KEY (and COUNTERSIGN_URL)")
    asyncio.run(host(parser.parse_args()))


if __name__ == "__main__":
    main()
