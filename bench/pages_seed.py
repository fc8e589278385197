"""Seed data for `bench_pages`: a few runs made by the real services against the sandbox, then
cloned by COPY into many runs with new ids, shifted times and recomputed hash chains.

The templates (per tenant): a *busy* run of ~45 calls (emails, refunds, one approved and one
rejected by a person, lost responses that reconciliation found and some it has not yet) and a
*pending* run whose one big refund waits for an approver. Cloning copies every row of a
template run (the run, its decisions, calls, dependencies, approvals, people's decisions,
attempts, receipts, events), replacing each id it finds — in any column and inside JSON
payloads — by a new one of the same prefix, and moving every time by the clone's offset. Each
cloned event's hash is computed again over the bytes `runs.events.compute_hash` hashes, so
`verify_event_chain` passes on the result.

Each template is compiled once (`bench/pages_clone.py`): a clone's rows and canonical event
bodies are format strings filled with its ids and times, so a cloned event costs one SHA-256
and a few `format_map` calls. The first clone of each template is checked against
`compute_hash` itself before any of its rows is committed.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.db import connection, transaction

from approvals.models import Approval
from bench.pages_clone import Clone, Compiled, EventShape, check_hashes, event_shape
from runs import services as run_services
from runs.events import BODY_ATTNAMES
from runs.models import Event, Run, Tenant, User
from sandbox.seed import seed_captured_cents
from toolcalls import dispatch, gate, reconcile
from toolcalls.models import E, ToolCall
from toolcalls.propose import tool_call_propose

TENANTS = (("acme", range(1, 16)), ("globex", range(16, 21)), ("initech", range(21, 41)))
PEOPLE = {"alice": "approver", "bob": "approver", "olivia": "admin"}
PASSWORD = "bench-pages-password"

# Tables of a run, parents first; each with the SQL that selects a template run's rows.
# Serial `id` columns are left out so that PostgreSQL numbers the copies.
CLONED_TABLES = (
    ("runs_run", "id = ANY(%(runs)s)"),
    ("runs_decision", "run_id = ANY(%(runs)s)"),
    ("toolcalls_toolcall", "run_id = ANY(%(runs)s)"),
    (
        "toolcalls_toolcall_depends_on",
        "from_toolcall_id IN (SELECT id FROM toolcalls_toolcall WHERE run_id = ANY(%(runs)s))",
    ),
    ("approvals_approval", "run_id = ANY(%(runs)s)"),
    (
        "approvals_approvaldecision",
        "approval_id IN (SELECT id FROM approvals_approval WHERE run_id = ANY(%(runs)s))",
    ),
    ("toolcalls_attempt", "run_id = ANY(%(runs)s)"),
    (
        "toolcalls_receipt",
        "tool_call_id IN (SELECT id FROM toolcalls_toolcall WHERE run_id = ANY(%(runs)s))",
    ),
)
SERIAL_TABLES = {"toolcalls_toolcall_depends_on", "approvals_approvaldecision"}
EVENT_COLUMNS = [*BODY_ATTNAMES, "hash"]


@dataclass
class Template:
    tenant: Tenant
    run_id: str
    kind: str  # busy | pending
    rows: dict[str, tuple[list[str], list[tuple]]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    compiled: Compiled = field(default_factory=Compiled)
    cells: dict[str, list[list[tuple[int, Any]]]] = field(default_factory=dict)
    shapes: list[EventShape] = field(default_factory=list)
    checked: bool = False


# --- the templates, through the real services -------------------------------------------------


def make_people() -> dict[str, dict[str, User]]:
    people: dict[str, dict[str, User]] = {}
    for slug, _ in TENANTS:
        tenant = Tenant.objects.filter(slug=slug).first() or run_services.tenant_create(
            slug=slug, name=slug.title()
        )
        people[slug] = {}
        for name, role in PEOPLE.items():
            username = name if slug == "acme" else f"{name}-{slug}"
            user = User.objects.filter(username=username).first()
            if user is None:
                user = User.objects.create_user(
                    username=username, password=PASSWORD, tenant=tenant, role=role
                )
            people[slug][name] = user
    return people


def _richest(orders: range) -> str:
    return f"order-{max(orders, key=seed_captured_cents):03d}"


def _settle(call: ToolCall) -> None:
    dispatch.tool_call_dispatch(tool_call_id=call.pk)


def _decide(call: ToolCall, user: User, approve: bool) -> None:
    approval = Approval.objects.filter(tool_call=call).latest("created_at")
    command = {
        "tenant": call.tenant,
        "approval_id": approval.pk,
        "user": user,
        "seen_version": approval.version,
        "seen_summary_hash": approval.summary_hash,
    }
    if approve:
        gate.tool_call_approve(**command, reason="checked the order")
        _settle(ToolCall.objects.get(pk=call.pk))
    else:
        gate.tool_call_reject(**command, reason="not this order")


# long: one template run, step by step as an agent and two approvers would take it.
def make_busy_run(tenant: Tenant, orders: range, people: dict[str, User], sandbox: str) -> str:
    key, _ = run_services.api_key_issue(tenant=tenant, name="bench agent", scopes=["*"])
    actor = run_services.actor_for_key(key)
    run, _ = run_services.run_start(
        tenant=tenant, title="Refunds and notices", actor=actor, api_key=key
    )

    def propose(capability: str, args: dict[str, Any], intent: str) -> ToolCall:
        call, _ = tool_call_propose(
            tenant=tenant,
            run_id=run.pk,
            capability_id=capability,
            args=args,
            intent=f"{run.pk}-{intent}",  # the run's id makes every clone's key its own
            actor=actor,
            api_key=key,
        )
        return call

    lost: list[ToolCall] = []
    for i in range(40):
        order = f"order-{orders[i % len(orders)]:03d}"
        args = {
            "order_id": order,
            "to": f"customer-{orders[i % len(orders)]:03d}@example.com",
            "subject": f"About {order}",
            "body": f"Notice {i} about your order {order}.",
        }
        if i % 10 == 3:  # a lost answer: the mail went out, the response did not come back
            httpx.post(
                f"{sandbox}/faults",
                json={"system": "mailer", "drop_response_after_commit": 1.0, "times": 1},
            ).raise_for_status()
        call = propose("send-email-v1", args, f"notice-{i}")
        _settle(call)
        if i % 10 == 3:
            lost.append(call)
    time.sleep(2.1)  # past the mailer's consistency window, so a look-up is proof
    for call in lost[:2]:
        reconcile.tool_call_reconcile(tool_call_id=call.pk)
    richest = _richest(orders)
    small = propose(
        "refund-order-v2", {"order_id": richest, "amount_cents": 2500, "currency": "USD"}, "small"
    )
    _settle(small)
    big = {"order_id": richest, "amount_cents": 20_100, "currency": "USD", "reason": "damaged"}
    _decide(propose("refund-order-v2", big, "big-1"), people["bob"], approve=False)
    _decide(propose("refund-order-v2", big, "big-2"), people["alice"], approve=True)
    return run.pk


def make_pending_run(tenant: Tenant, orders: range) -> str:
    key, _ = run_services.api_key_issue(tenant=tenant, name="bench approvals", scopes=["*"])
    actor = run_services.actor_for_key(key)
    run, _ = run_services.run_start(tenant=tenant, title="A big refund", actor=actor, api_key=key)
    args = {"order_id": _richest(orders), "amount_cents": 30_000, "currency": "USD"}
    call, _ = tool_call_propose(
        tenant=tenant,
        run_id=run.pk,
        capability_id="refund-order-v2",
        args={**args, "reason": "arrived broken"},
        intent=f"{run.pk}-big",
        actor=actor,
        api_key=key,
    )
    assert call.execution_status == E.AWAITING_APPROVAL, call.execution_status
    return run.pk


def make_templates(sandbox: str) -> list[Template]:
    people = make_people()
    templates = []
    for slug, orders in TENANTS:
        tenant = Tenant.objects.get(slug=slug)
        busy = make_busy_run(tenant, orders, people[slug], sandbox)
        pending = make_pending_run(tenant, orders)
        templates += [Template(tenant, busy, "busy"), Template(tenant, pending, "pending")]
    for template in templates:
        load_template(template)
    return templates


def load_template(template: Template) -> None:
    with connection.cursor() as cursor:
        for table, where in CLONED_TABLES:
            cursor.execute(f"SELECT * FROM {table} WHERE {where}", {"runs": [template.run_id]})
            columns = [c.name for c in cursor.description]
            rows = cursor.fetchall()
            if table in SERIAL_TABLES:
                keep = [i for i, name in enumerate(columns) if name != "id"]
                columns = [columns[i] for i in keep]
                rows = [tuple(row[i] for i in keep) for row in rows]
            template.rows[table] = (columns, rows)
    template.events = list(
        Event.objects.filter(run_id=template.run_id).order_by("seq").values(*EVENT_COLUMNS)
    )
    for table, (_, rows) in template.rows.items():
        template.cells[table] = [template.compiled.row(row) for row in rows]
    template.shapes = [
        event_shape(template.compiled, row, EVENT_COLUMNS) for row in template.events
    ]


# --- clones (bench/pages_clone.py) ---------------------------------------------------------


def copy_clones(batch: list[tuple[Template, Clone]]) -> int:
    """Write one batch of clones with one COPY per table; returns the events written."""
    written = 0
    raw = connection.connection  # psycopg 3: COPY FROM STDIN with rows, no text escaping here
    for template, clone in batch:
        clone.prepare(template.compiled)
    with transaction.atomic(), raw.cursor() as cursor:
        for table, _ in CLONED_TABLES:
            columns = batch[0][0].rows[table][0]
            names = ", ".join(columns)
            with cursor.copy(f"COPY {table} ({names}) FROM STDIN") as copy:
                for template, clone in batch:
                    for cells in template.cells[table]:
                        copy.write_row(clone.row(cells))
        with cursor.copy(f"COPY runs_event ({', '.join(EVENT_COLUMNS)}) FROM STDIN") as copy:
            for template, clone in batch:
                rows = clone.events(template.shapes)
                if not template.checked:
                    check_hashes(rows, EVENT_COLUMNS)
                    template.checked = True
                for row in rows:
                    copy.write_row(row)
                written += len(rows)
    return written


@dataclass
class Plan:
    busy_per_tenant: int
    pending_per_tenant: int


def plan_for(templates: list[Template], events: int, approvals: int) -> Plan:
    pending_events = sum(len(t.events) for t in templates if t.kind == "pending")
    busy_events = sum(len(t.events) for t in templates if t.kind == "busy")
    tenants = len(TENANTS)
    pending_per_tenant = max(1, approvals // tenants)
    left = events - pending_per_tenant * pending_events
    return Plan(max(1, round(left / busy_events)), pending_per_tenant)


def clone_all(
    templates: list[Template], plan: Plan, *, batch_size: int = 200, echo: Any = print
) -> int:
    """Every clone the plan asks for, busy runs spread over 30 days (a tenth of them in the
    last day), pending ones over the last 20 hours (their approvals expire after 24)."""
    now = datetime.now().astimezone()
    todo: list[tuple[Template, Clone]] = []
    rng = random.Random(12)
    for template in templates:
        count = plan.busy_per_tenant if template.kind == "busy" else plan.pending_per_tenant
        for _ in range(count):
            if template.kind == "pending":
                seconds = rng.uniform(60, 20 * 3600)
            elif rng.random() < 0.1:
                seconds = rng.uniform(60, 24 * 3600)
            else:
                seconds = rng.uniform(24 * 3600, 30 * 24 * 3600)
            # Whole seconds: every stored time keeps its microseconds and its format.
            todo.append((template, Clone(timedelta(seconds=-int(seconds)), now)))
    rng.shuffle(todo)
    written, started = 0, time.monotonic()
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        by_template: dict[int, list[tuple[Template, Clone]]] = {}
        for item in batch:
            by_template.setdefault(id(item[0]), []).append(item)
        for group in by_template.values():
            written += copy_clones(group)
        rate = written / max(time.monotonic() - started, 1e-9)
        echo(f"  cloned {start + len(batch)}/{len(todo)} runs, {written} events ({rate:.0f}/s)")
    return written


def counts() -> dict[str, int]:
    return {
        "tenants": Tenant.objects.count(),
        "runs": Run.objects.count(),
        "tool calls": ToolCall.objects.count(),
        "pending approvals": Approval.objects.filter(state=Approval.State.PENDING).count(),
        "events": Event.objects.count(),
    }
