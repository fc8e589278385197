"""The people and agents of `manage.py soak`, over HTTP only.

An `Agent` is one agent of a tenant speaking the agent API over HTTP:
refund requests (read the order, decide, refund, email the customer once the refund is
confirmed) and spare-part replacements (check warranty and stock, reserve the part, ship it,
email; a refused address releases the reservation). It sends a request again after a 5xx,
a 429 or a dropped connection, as a real agent would; proposals are idempotent by intent.

An `Approver` is a tenant's two approvers at the console: it logs in through the login form,
reads the inbox page, opens each approval and posts the decision form it shows. Whether an
approval is approved, rejected or left to expire is decided by its id (`fate`), so the share
of each is stable from run to run.
"""

from __future__ import annotations

import hashlib
import logging
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx

from bench.soak_world import Tenant

log = logging.getLogger("soak")
# Nothing more happens to a call in these without a person asking.
SETTLED = {"completed", "failed", "rejected", "expired", "invalidated", "cancelled"}
SETTLED |= {"compensated", "needs_human"}


def is_settled(call: dict[str, Any]) -> bool:
    return call["execution_status"] in SETTLED and call["verification_status"] != "pending"


def result_of(call: dict[str, Any]) -> dict[str, Any]:
    """What the system answered (`raw_result` where the API gives both)."""
    return call.get("raw_result") or call.get("result") or {}


class ApiError(Exception):
    """The API refused a request: its status and stable error name."""

    def __init__(self, status: int, name: str, message: str) -> None:
        super().__init__(f"{status} {name}: {message}")
        self.status, self.name = status, name


class AgentApi:
    """The agent API over plain HTTP, as an agent in any language speaks it."""

    def __init__(self, base_url: str, api_key: str) -> None:
        self.http = httpx.Client(
            base_url=f"{base_url}/api/v1",
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=40,
        )

    def call(self, method: str, path: str, body: Any = None, **options: Any) -> dict[str, Any]:
        response = self.http.request(method, path, json=body, **options)
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
            except (ValueError, KeyError, TypeError):
                error = {"name": "http.error", "message": response.text[:200]}
            raise ApiError(response.status_code, error.get("name", "?"), error.get("message", ""))
        return response.json()

    def start_run(self, title: str, idempotency_key: str) -> dict[str, Any]:
        return self.call(
            "POST", "/runs", {"title": title}, headers={"Idempotency-Key": idempotency_key}
        )

    def propose(
        self, run_id: str, capability: str, args: dict[str, Any], *, intent: str, **fields: Any
    ) -> dict[str, Any]:
        body = {"capability": capability, "args": args, "intent": intent}
        body.update({name: value for name, value in fields.items() if value})
        return self.call("POST", f"/runs/{run_id}/tool-calls", body)

    def record_decision(self, run_id: str, kind: str, content: dict[str, Any]) -> dict[str, Any]:
        return self.call("POST", f"/runs/{run_id}/decisions", {"kind": kind, "content": content})

    def give_up_run(self, run_id: str, reason: str) -> dict[str, Any]:
        body = {"failed_permanently": True, "reason": reason}
        return self.call("POST", f"/runs/{run_id}/complete", body)

    def tool_call(self, tool_call_id: str, wait: float = 0, since: str = "") -> dict[str, Any]:
        params: dict[str, Any] = {"wait": wait, **({"since": since} if since else {})}
        return self.call("GET", f"/tool-calls/{tool_call_id}", params=params)

    def compensate(self, tool_call_id: str) -> dict[str, Any]:
        return self.call("POST", f"/tool-calls/{tool_call_id}/compensate")

    def wait_settled(self, tool_call_id: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        call = self.tool_call(tool_call_id)
        while time.monotonic() < deadline and not is_settled(call):
            wait = min(20, max(deadline - time.monotonic(), 0))
            call = self.tool_call(tool_call_id, wait=wait, since=call["updated_at"])
        return call

    def close(self) -> None:
        self.http.close()


class Stats:
    """Counters shared by every agent and approver thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[key] += n


class Stopped(Exception):
    """The soak stopped new work while a flow was under way."""


class GaveUp(Exception):
    """A request failed every time it was sent."""


class Agent(threading.Thread):
    def __init__(
        self, base_url: str, tenant: Tenant, number: int, stats: Stats, seed: int, think: float
    ) -> None:
        super().__init__(name=f"{tenant.slug}-agent{number}", daemon=True)
        self.agent_api = AgentApi(base_url, tenant.api_key)
        self.tenant, self.stats, self.think = tenant, stats, think
        self.rng = random.Random(seed)
        self.stopping = threading.Event()  # no new flows, no new proposals in a flow
        self.finished = threading.Event()  # follow-ups too: the soak is over
        self.followups: list[dict[str, str]] = []

    def run(self) -> None:
        number = 0
        while not self.stopping.is_set():
            number += 1
            self.attempt(self.follow_up)
            flow = self.replace_part if self.rng.random() < 0.35 else self.refund
            self.attempt(flow, f"{self.name}-{number}")
            self.stopping.wait(self.think * self.rng.uniform(0.5, 1.5))
        while self.followups and not self.finished.wait(2):
            self.attempt(self.follow_up)
        self.agent_api.close()

    def attempt(self, flow: Callable[..., None], *args: Any) -> None:
        try:
            flow(*args)
        except Stopped:
            self.stats.add("agent flows cut short by the end of the load")
        except (ApiError, GaveUp):
            pass  # counted where it was refused
        except Exception as exc:  # a bug in the soak's own agent: count it, keep going
            log.exception("soak agent %s", self.name)
            self.stats.add(f"agent errors: {type(exc).__name__}")

    def api(self, method: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any) -> Any:
        """Send until answered; a 4xx is the answer (counted, raised)."""
        delay = 0.5
        for _ in range(12):
            try:
                return method(*args, **kwargs)
            except ApiError as exc:
                if exc.status < 500 and exc.status != 429:
                    self.stats.add(f"API refusals: {exc.status} {exc.name}")
                    raise
                self.stats.add(f"API answers sent again: {exc.status} {exc.name}")
            except httpx.TransportError as exc:
                self.stats.add(f"API answers sent again: {type(exc).__name__}")
            time.sleep(delay)
            delay = min(delay * 2, 5)
        self.stats.add("API requests given up after 12 tries")
        raise GaveUp(method.__name__)

    def new(self, method: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any) -> Any:
        """New work (a run, a proposal): only while the load lasts."""
        if self.stopping.is_set():
            raise Stopped
        return self.api(method, *args, **kwargs)

    def settled(self, call: dict[str, Any]) -> dict[str, Any]:
        return self.api(self.agent_api.wait_settled, call["tool_call_id"], timeout=90)

    # --- refunds ---------------------------------------------------------------------------

    def amount(self, refundable: int) -> int:
        """Most refunds are small and go through alone; about a quarter need an approver,
        a few (over $1,000) two."""
        roll = self.rng.random()
        if roll < 0.05 and refundable > 100_500:
            return self.rng.randint(100_001, min(refundable, 110_000))
        if roll < 0.28 and refundable > 20_500:
            return self.rng.randint(20_001, min(refundable, 60_000))
        return self.rng.randint(100, min(refundable, 2_000)) if refundable >= 100 else 0

    def refund(self, tag: str) -> None:
        order = self.rng.choice(self.tenant.orders)
        run = self.new(self.agent_api.start_run, f"Refund {order['id']}", idempotency_key=tag)
        run_id = run["run_id"]
        read = self.new(
            self.agent_api.propose,
            run_id,
            "get-order-v1",
            {"order_id": order["id"]},
            intent=f"{tag}-read",
        )
        read = self.settled(read)
        if read["verification_status"] != "confirmed_success":
            self.stats.add(f"order reads ending {read['execution_status']}")
            return
        live = result_of(read)
        amount = self.amount(live["refundable_cents"])
        decision = self.api(
            self.agent_api.record_decision,
            run_id,
            "refund_eligibility",
            {"order_id": order["id"], "amount_cents": amount, "eligible": amount > 0},
        )
        if not amount:
            self.stats.add("refund requests with nothing left to refund")
            return
        args = {"order_id": order["id"], "amount_cents": amount, "currency": "USD"}
        refund = self.new(
            self.agent_api.propose,
            run_id,
            "refund-order-v2",
            {**args, "reason": "soak"},
            intent=f"{tag}-refund",
            decision_id=decision["decision_id"],
        )
        self.stats.add("refunds proposed")
        if refund["execution_status"] == "awaiting_approval":
            self.stats.add("refunds held for approvers")
        email = {
            "order_id": order["id"],
            "to": live["customer_email"],
            "subject": "Your refund",
            "body": f"We refunded {amount / 100:.2f} USD on {order['id']}.",
        }
        # Sent once the refund is confirmed; cancelled if it never is (the task graph).
        self.new(
            self.agent_api.propose,
            run_id,
            "send-email-v1",
            email,
            intent=f"{tag}-email",
            decision_id=decision["decision_id"],
            depends_on=[refund["tool_call_id"]],
        )

    # --- spare parts -----------------------------------------------------------------------

    # long: one business flow read top to bottom (checks, decision, reserve, ship, notify)
    def replace_part(self, tag: str) -> None:
        order = self.rng.choice(self.tenant.orders)
        sku, warehouse = order["sku"], self.rng.choice(self.tenant.warehouses)
        title = f"Replace the part of {order['id']}"
        run_id = self.new(self.agent_api.start_run, title, idempotency_key=tag)["run_id"]
        warranty = self.new(
            self.agent_api.propose,
            run_id,
            "check-warranty-v1",
            {"order_id": order["id"]},
            intent=f"{tag}-warranty",
        )
        stock = self.new(
            self.agent_api.propose,
            run_id,
            "check-stock-v1",
            {"warehouse_id": warehouse, "sku": sku},
            intent=f"{tag}-stock",
        )
        warranty, stock = self.settled(warranty), self.settled(stock)
        covered = bool(result_of(warranty).get("in_warranty"))
        available = result_of(stock).get("stock", {}).get(sku, 0)
        decision = self.api(
            self.agent_api.record_decision,
            run_id,
            "replacement_eligibility",
            {"order_id": order["id"], "in_warranty": covered, "available": available},
        )
        if not covered or available < 1:
            self.stats.add("replacements refused (no warranty or no stock)")
            self.api(self.agent_api.give_up_run, run_id, "not eligible")
            return
        reserve = self.new(
            self.agent_api.propose,
            run_id,
            "reserve-stock-v1",
            {"warehouse_id": warehouse, "sku": sku, "quantity": 1, "order_id": order["id"]},
            intent=f"{tag}-reserve",
            decision_id=decision["decision_id"],
            depends_on=[warranty["tool_call_id"], stock["tool_call_id"]],
        )
        self.stats.add("replacements proposed")
        last = reserve
        if self.tenant.addresses:
            refused = self.tenant.bad_addresses and self.rng.random() < 0.2
            addresses = self.tenant.bad_addresses if refused else self.tenant.addresses
            address = self.rng.choice(addresses)
            last = self.new(
                self.agent_api.propose,
                run_id,
                "create-waybill-v1",
                {"order_id": order["id"], "address_id": address},
                intent=f"{tag}-ship",
                decision_id=decision["decision_id"],
                depends_on=[reserve["tool_call_id"]],
            )
            self.followups.append(
                {"waybill": last["tool_call_id"], "reservation": reserve["tool_call_id"]}
            )
        email = {
            "order_id": order["id"],
            "to": order["customer_email"],
            "subject": "Your replacement part",
            "body": "It is on its way.",
        }
        self.new(
            self.agent_api.propose,
            run_id,
            "send-email-v1",
            email,
            intent=f"{tag}-notify",
            decision_id=decision["decision_id"],
            depends_on=[last["tool_call_id"]],
        )

    def follow_up(self) -> None:
        """A waybill the carrier refused leaves a reservation to release (compensate)."""
        for item in list(self.followups):
            waybill = self.api(self.agent_api.tool_call, item["waybill"])
            if not is_settled(waybill):
                continue
            self.followups.remove(item)
            if waybill["execution_status"] != "failed":
                continue
            reservation = self.api(self.agent_api.tool_call, item["reservation"])
            if reservation["verification_status"] == "confirmed_success":
                self.api(self.agent_api.compensate, item["reservation"])
                self.stats.add("reservations released after a refused address")


# --- the approvers ------------------------------------------------------------------------

APPROVAL_LINK = re.compile(r'href="/approvals/(apr_[A-Za-z0-9]+)/"')
FORM_FIELD = re.compile(r'name="(version|summary_hash)" value="([^"]*)"')


def fate(approval_id: str, leave: float = 0.15, reject: float = 0.15) -> str:
    share = int(hashlib.sha256(approval_id.encode()).hexdigest(), 16) % 1000 / 1000
    if share < leave:
        return "leave"
    return "reject" if share < leave + reject else "approve"


class Approver(threading.Thread):
    def __init__(self, base_url: str, tenant: Tenant, stats: Stats) -> None:
        super().__init__(name=f"{tenant.slug}-approvers", daemon=True)
        self.base_url, self.tenant, self.stats = base_url, tenant, stats
        self.sessions: list[httpx.Client] = []
        self.decided: Counter[str] = Counter()  # approval id -> decisions posted
        self.left: set[str] = set()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            try:
                if not self.sessions:
                    self.sessions = [self.login(*person) for person in self.tenant.approvers]
                self.one_pass()
            except (httpx.HTTPError, LoginRefused) as exc:
                self.stats.add(f"console requests sent again: {type(exc).__name__}")
                self.close()
        self.close()
        self.stats.add("approvals left to expire", len(self.left))

    def close(self) -> None:
        for session in self.sessions:
            session.close()
        self.sessions = []

    def login(self, username: str, password: str) -> httpx.Client:
        session = httpx.Client(base_url=self.base_url, timeout=30)
        session.get("/login/")
        form = {
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": session.cookies.get("csrftoken", ""),
        }
        if session.post("/login/", data=form).status_code != 302:
            session.close()
            raise LoginRefused(username)
        return session

    def one_pass(self) -> None:
        inbox = self.sessions[0].get("/approvals/")
        if inbox.status_code != 200:
            raise LoginRefused(f"the inbox answered {inbox.status_code}")
        for approval_id in dict.fromkeys(APPROVAL_LINK.findall(inbox.text)):
            what = fate(approval_id)
            if what == "leave":
                self.left.add(approval_id)
                continue
            # The first approver decides first; an approval still pending after that needs
            # a second, distinct person.
            session = self.sessions[min(self.decided[approval_id], len(self.sessions) - 1)]
            self.decide(session, approval_id, what)

    def decide(self, session: httpx.Client, approval_id: str, what: str) -> None:
        page = session.get(f"/approvals/{approval_id}/")
        form = dict(FORM_FIELD.findall(page.text))
        if page.status_code != 200 or len(form) != 2:
            return  # nothing to decide on this page any more
        response = session.post(
            f"/approvals/{approval_id}/{what}/",
            data={**form, "reason": f"soak: scripted {what}"},
            headers={"X-CSRFToken": session.cookies.get("csrftoken", "")},
        )
        self.decided[approval_id] += 1
        if response.status_code == 302:
            self.stats.add(f"approval decisions posted: {what}")
        else:
            self.stats.add(f"approval decisions refused: {what} {response.status_code}")


class LoginRefused(Exception):
    pass
