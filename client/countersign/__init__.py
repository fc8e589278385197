"""Countersign's Python client: what an agent imports to hand its side effects over.

    from countersign import Countersign
    cs = Countersign("http://127.0.0.1:8000", api_key)

`AsyncCountersign` is the same, awaited; `verify_webhook` checks a webhook delivery. The core
depends on httpx only; the integrations are extras (`pip install "./client[mcp]"` …).
"""

from countersign._core import CountersignError
from countersign.aio import AsyncCountersign
from countersign.client import Countersign
from countersign.types import (
    TERMINAL,
    Decision,
    PolicyEvaluation,
    Run,
    Status,
    ToolCall,
    is_terminal,
)
from countersign.webhooks import WebhookVerificationError, verify_webhook

__all__ = [
    "TERMINAL",
    "AsyncCountersign",
    "Countersign",
    "CountersignError",
    "Decision",
    "PolicyEvaluation",
    "Run",
    "Status",
    "ToolCall",
    "WebhookVerificationError",
    "is_terminal",
    "verify_webhook",
]
