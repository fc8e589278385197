"""The demo's scripted agent: it talks to the agent API over HTTP like any real agent would.

It works through refund requests for the sandbox's seeded orders: validate the request, read
the order, decide the amount, ask for the refund (over $200 a person must approve it in the
console), email the customer once the refund is confirmed, and write an audit record. The
demo injects some faults in the sandbox, so the console shows lost responses being looked up
and rate limits retried.
"""

from __future__ import annotations

import itertools
import logging
import threading

from runs.client import Countersign, CountersignError, is_settled

log = logging.getLogger("countersign.demo_agent")

# (order, amount in cents the customer asked for, reason) from the sandbox's seeded orders.
REFUND_REQUESTS = [
    ("order-001", 1200, "item arrived damaged"),
    ("order-002", 3500, "wrong size"),
    ("order-003", 25000, "duplicate charge"),
    ("order-004", 400, "late delivery goodwill"),
    ("order-005", 900, "missing part"),
]


class DemoAgent(threading.Thread):
    def __init__(self, base_url: str, api_key: str, interval: float = 8.0) -> None:
        super().__init__(name="demo-agent", daemon=True)
        self.client = Countersign(base_url, api_key)
        self.interval = interval
        self.stopping = threading.Event()
        # Refunds proposed and not yet settled: tool call id -> (run, order, decision, intent).
        self.pending: dict[str, tuple[str, dict, str, str]] = {}

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        for number in itertools.count(1):
            if self.stopping.wait(self.interval if number > 1 else 1.0):
                break
            try:
                self.follow_up()
                self.handle_one(number)
            except (CountersignError, OSError) as exc:
                # Keep going: the demo shows the next request, and the error is in the log.
                log.warning("demo agent: %s", exc)
        self.client.close()

    def handle_one(self, number: int) -> None:
        """One refund request: validate, read the order, decide, ask for the refund."""
        order_id, amount_cents, reason = REFUND_REQUESTS[number % len(REFUND_REQUESTS)]
        # A fresh intent per demo round: each round is a new refund request.
        intent = f"demo-{number}"
        run = self.client.start_run(
            f"Refund {order_id}: {reason}",
            correlation_id=f"refund-intent-{number:03d}",
            idempotency_key=f"demo-refund-{number}-{order_id}",
            max_tool_calls=10,
            metadata={"order_id": order_id, "requested_cents": amount_cents},
        )
        run_id = run["run_id"]
        order_call = self.client.propose(
            run_id, "get-order-v1", {"order_id": order_id}, intent=f"{intent}-read"
        )
        order = self.client.wait_settled(order_call["tool_call_id"], timeout=30)["result"] or {}
        amount = min(amount_cents, order.get("refundable_cents", 0))
        decision = self.client.record_decision(
            run_id,
            "refund_eligibility",
            {"order_id": order_id, "eligible": amount > 0, "amount_cents": amount, "why": reason},
        )
        if amount <= 0:
            log.info("demo agent: %s: %s has nothing left to refund", run_id, order_id)
            return
        refund = self.client.propose(
            run_id,
            "refund-order-v2",
            {"order_id": order_id, "amount_cents": amount, "currency": "USD", "reason": reason},
            intent=intent,
            decision_id=decision["decision_id"],
        )
        if refund["execution_status"] == "awaiting_approval":
            # Refunds over $200 wait for a person; look again on the next rounds.
            log.info(
                "demo agent: %s refund %s awaits approval %s",
                run_id,
                refund["tool_call_id"],
                refund["approval"]["approval_id"],
            )
        else:
            refund = self.client.wait_settled(refund["tool_call_id"], timeout=60)
        self.pending[refund["tool_call_id"]] = (run_id, order, decision["decision_id"], intent)
        self.follow_up()

    def follow_up(self) -> None:
        """For each refund that reached its outcome: email the customer if it was confirmed,
        and write the audit record either way."""
        for tool_call_id, (run_id, order, decision_id, intent) in list(self.pending.items()):
            refund = self.client.tool_call(tool_call_id)
            if not is_settled(refund):
                continue
            del self.pending[tool_call_id]
            log.info(
                "demo agent: %s refund %s is %s / %s",
                run_id,
                tool_call_id,
                refund["execution_status"],
                refund["verification_status"],
            )
            confirmed = refund["verification_status"] == "confirmed_success"
            if confirmed:
                amount = refund["args"]["amount_cents"]
                self.client.propose(
                    run_id,
                    "send-email-v1",
                    {
                        "order_id": order["id"],
                        "to": order["customer_email"],
                        "subject": "Your refund",
                        "body": f"We refunded {amount / 100:.2f} USD on {order['id']}.",
                    },
                    intent=f"{intent}-email",
                    decision_id=decision_id,
                )
            self.client.record_decision(
                run_id,
                "refund_audit",
                {
                    "tool_call_id": tool_call_id,
                    "outcome": refund["execution_status"],
                    "verified": refund["verification_status"],
                    "refund_id": refund["external_id"],
                    "amount_cents": refund["args"]["amount_cents"],
                },
            )
