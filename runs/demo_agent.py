"""The demo's scripted agent: it talks to the agent API over HTTP like any real agent would.

It works through the seeded orders of the sandbox, one run per refund request, so that the
console has live work to show.
"""

from __future__ import annotations

import itertools
import logging
import threading

from runs.client import Countersign, CountersignError

log = logging.getLogger("countersign.demo_agent")

# (order, amount in cents the customer asked for, reason) from the sandbox's seeded orders.
REFUND_REQUESTS = [
    ("order-001", 12000, "item arrived damaged"),
    ("order-002", 35000, "wrong size"),
    ("order-003", 150000, "duplicate charge"),
    ("order-004", 4000, "late delivery goodwill"),
]


class DemoAgent(threading.Thread):
    def __init__(self, base_url: str, api_key: str, interval: float = 8.0) -> None:
        super().__init__(name="demo-agent", daemon=True)
        self.client = Countersign(base_url, api_key)
        self.interval = interval
        self.stopping = threading.Event()

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        for number in itertools.count(1):
            if self.stopping.wait(self.interval if number > 1 else 1.0):
                break
            try:
                self.handle_one(number)
            except (CountersignError, OSError) as exc:
                # Keep going: the demo shows the next request, and the error is in the log.
                log.warning("demo agent: %s", exc)
        self.client.close()

    def handle_one(self, number: int) -> None:
        order_id, amount_cents, reason = REFUND_REQUESTS[number % len(REFUND_REQUESTS)]
        run = self.client.start_run(
            f"Refund {order_id}: {reason}",
            correlation_id=f"refund-intent-{number:03d}",
            idempotency_key=f"demo-refund-{number}-{order_id}",
            max_tool_calls=10,
            metadata={"order_id": order_id, "requested_cents": amount_cents},
        )
        decision = self.client.record_decision(
            run["run_id"],
            "refund_eligibility",
            {"order_id": order_id, "eligible": True, "amount_cents": amount_cents, "why": reason},
        )
        if amount_cents > 100000:
            # A second look lowers a large refund: a new version supersedes the first.
            self.client.record_decision(
                run["run_id"],
                "refund_eligibility",
                {"order_id": order_id, "eligible": True, "amount_cents": amount_cents // 2},
                supersedes=decision["decision_id"],
            )
        log.info("demo agent: %s for %s", run["run_id"], order_id)
