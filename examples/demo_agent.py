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

from countersign import Countersign, CountersignError, is_terminal

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
        # Runs whose work is all proposed: finished (with their exit type) once it settles.
        self.to_finish: set[str] = set()

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        for number in itertools.count(1):
            if self.stopping.wait(self.interval if number > 1 else 1.0):
                break
            try:
                self.follow_up()
                if number % 3 == 0:
                    self.replace_part(number)
                else:
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
        order = self.client.wait(order_call["tool_call_id"], timeout=30)["result"] or {}
        amount = min(amount_cents, order.get("refundable_cents", 0))
        decision = self.client.record_decision(
            run_id,
            "refund_eligibility",
            {"order_id": order_id, "eligible": amount > 0, "amount_cents": amount, "why": reason},
        )
        if amount <= 0:
            log.info("demo agent: %s: %s has nothing left to refund", run_id, order_id)
            self.to_finish.add(run_id)
            return
        refund = self.client.propose(
            run_id,
            "refund-order-v2",
            {"order_id": order_id, "amount_cents": amount, "currency": "USD", "reason": reason},
            intent=intent,
            decision_id=decision["decision_id"],
        )
        if refund["status"] == "awaiting_approval":
            # Refunds over $200 wait for a person; look again on the next rounds.
            log.info(
                "demo agent: %s refund %s awaits approval %s",
                run_id,
                refund["tool_call_id"],
                refund["approval"]["approval_id"],
            )
        else:
            refund = self.client.wait(refund["tool_call_id"], timeout=60)
        self.pending[refund["tool_call_id"]] = (run_id, order, decision["decision_id"], intent)
        self.follow_up()

    def replace_part(self, number: int) -> None:
        """The spare-part flow of the third seed: check warranty and stock in parallel, reserve
        the part, create the waybill, notify. Done means one valid reservation and one valid
        waybill, not that every step said "done". A refused address releases the stock."""
        order_id = f"order-{(number // 3) % 8 + 3:03d}"
        # Every fourth replacement ships to an address the carrier refuses.
        address_id = "addr-bad-001" if number % 4 == 3 else f"addr-{number % 10 + 1:03d}"
        intent = f"part-{number}"
        run_id = self.client.start_run(
            f"Replace the part of {order_id}",
            correlation_id=f"replacement-{number:03d}",
            idempotency_key=f"demo-part-{number}",
            max_tool_calls=10,
        )["run_id"]
        warranty = self.client.propose(
            run_id, "check-warranty-v1", {"order_id": order_id}, intent=f"{intent}-warranty"
        )
        stock = self.client.propose(
            run_id,
            "check-stock-v1",
            {"warehouse_id": "wh-acme-1", "sku": "PART-100"},
            intent=f"{intent}-stock",
        )
        warranty = self.client.wait(warranty["tool_call_id"], timeout=30)
        stock = self.client.wait(stock["tool_call_id"], timeout=30)
        covered = bool((warranty["result"] or {}).get("in_warranty"))
        available = (stock["result"] or {}).get("stock", {}).get("PART-100", 0)
        decision = self.client.record_decision(
            run_id,
            "replacement_eligibility",
            {"order_id": order_id, "in_warranty": covered, "available": available},
        )
        if not covered or available < 1:
            self.client.finish_run(
                run_id,
                failed_permanently=True,
                reason="not under warranty" if not covered else "no stock",
            )
            return
        self.to_finish.add(run_id)  # once the graph below has settled
        reserve = self.client.propose(
            run_id,
            "reserve-stock-v1",
            {"warehouse_id": "wh-acme-1", "sku": "PART-100", "quantity": 1, "order_id": order_id},
            intent=f"{intent}-reserve",
            decision_id=decision["decision_id"],
            depends_on=[warranty["tool_call_id"], stock["tool_call_id"]],
        )
        # The task graph holds the waybill until the reservation is confirmed, and the email
        # until the waybill is.
        waybill = self.client.propose(
            run_id,
            "create-waybill-v1",
            {"order_id": order_id, "address_id": address_id},
            intent=f"{intent}-ship",
            decision_id=decision["decision_id"],
            depends_on=[reserve["tool_call_id"]],
        )
        self.client.propose(
            run_id,
            "send-email-v1",
            {
                "order_id": order_id,
                "to": f"customer-{order_id[-3:]}@example.com",
                "subject": "Your replacement part",
                "body": "It is on its way.",
            },
            intent=f"{intent}-notify",
            decision_id=decision["decision_id"],
            depends_on=[waybill["tool_call_id"]],
        )
        waybill = self.client.wait(waybill["tool_call_id"], timeout=60)
        if waybill["status"] == "failed":
            # The carrier refused the address after the stock was reserved: release it.
            self.client.compensate(reserve["tool_call_id"])
            log.info("demo agent: %s address refused; reservation released", run_id)
        else:
            log.info(
                "demo agent: %s waybill %s is %s / %s",
                run_id,
                waybill["tool_call_id"],
                waybill["execution_status"],
                waybill["verification_status"],
            )

    def follow_up(self) -> None:
        """For each refund that reached its outcome: email the customer if it was confirmed,
        and write the audit record either way. Then finish the runs whose work has settled."""
        self.follow_up_refunds()
        self.finish_settled_runs()

    def finish_settled_runs(self) -> None:
        """End each run whose calls have all settled; Countersign judges its exit type
        (completed, with degradation, or needs a person) from the calls."""
        for run_id in sorted(self.to_finish):
            try:
                run = self.client.finish_run(run_id)
            except CountersignError as exc:
                if exc.name == "run.work_in_flight":
                    continue  # some call is still on its way: try again next round
                if self.client.get_run(run_id)["state"] == "needs_human":
                    continue  # a person resolves an unknown outcome first, on the desk
                log.warning("demo agent: %s could not be finished: %s", run_id, exc)
            else:
                log.info("demo agent: %s finished: %s", run_id, run["state"])
            self.to_finish.discard(run_id)

    def follow_up_refunds(self) -> None:
        for tool_call_id, (run_id, order, decision_id, intent) in list(self.pending.items()):
            refund = self.client.tool_call(tool_call_id)
            if not is_terminal(refund):
                continue
            del self.pending[tool_call_id]
            log.info(
                "demo agent: %s refund %s is %s / %s",
                run_id,
                tool_call_id,
                refund["execution_status"],
                refund["verification_status"],
            )
            confirmed = refund["status"] == "succeeded"
            if confirmed:
                amount = refund["executed_args"]["amount_cents"]
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
                    "amount_cents": refund["executed_args"]["amount_cents"],
                },
            )
            self.to_finish.add(run_id)
