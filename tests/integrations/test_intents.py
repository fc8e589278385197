"""The intent an adapter makes from the framework's own tool-call id (countersign/_framework.py):
scoped by the run, as the API's pattern accepts, and never shared by two calls."""

from __future__ import annotations

import re

from countersign._framework import intent_for

INTENT = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")  # ToolCallIn.intent in toolcalls/api.py


def test_it_is_the_run_and_the_call_id() -> None:
    assert intent_for("run_01ABC", "call_refund_1") == "run_01ABC:call_refund_1"


def test_ids_the_api_would_refuse_become_ones_it_accepts_and_stay_distinct() -> None:
    odd = [intent_for("run_1", i) for i in ("call/1", "call 1", "call+1", "x" * 300)]
    assert all(INTENT.match(intent) for intent in odd)
    assert len(set(odd)) == len(odd)
    assert intent_for("run_1", "call/1") == intent_for("run_1", "call/1")
