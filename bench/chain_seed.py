"""Events for `manage.py bench_chain`, written quickly with the project's own hashing.

One run goes through the real services first (run_start, decision_record, run_finish), so
the shapes are the product's; the rest are written as the services would write them —
`run.started`, decisions, `run.completed` — hashed as `runs.events.compute_hash` hashes
(checked against it on the real run), chained per run, and copied in with COPY.
`verify_event_chain` and `rebuild_projections --verify` must both find them in order: the
benchmark prints their verdicts.
"""

from __future__ import annotations

import json
from datetime import UTC, timedelta
from hashlib import sha256
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from runs import services
from runs.events import GENESIS_HASH, compute_hash
from runs.ids import new_id
from runs.models import Decision, Event, Run, Tenant
from toolcalls.lifecycle import run_finish

DECISIONS_PER_RUN = 20  # and run.started, run.completed: 22 events a run
BATCH_RUNS = 200


def content(run_number: int, step: int) -> dict[str, Any]:
    return {
        "order_id": f"order-{run_number:06d}",
        "eligible": step % 3 != 0,
        "amount_cents": 1000 + step * 37,
        "reason": "duplicate charge on the card, customer called twice",
        "checked": ["warranty", "stock", f"step-{step}"],
    }


def seed(events: int) -> int:
    """Write about `events` events (whole runs); return how many the log holds."""
    tenant = Tenant.objects.create(slug="bench", name="bench_chain")
    first, _ = services.run_start(tenant=tenant, title="bench template", actor="bench")
    for step in range(DECISIONS_PER_RUN):
        services.decision_record(
            tenant=tenant,
            run_id=first.pk,
            kind="eligibility",
            content=content(0, step),
            actor="bench",
        )
    run_finish(tenant=tenant, run_id=first.pk, actor="bench")
    _check_fast_hash(first)
    runs = max(0, events // (DECISIONS_PER_RUN + 2) - 1)
    moment = timezone.now() - timedelta(days=1)
    for start in range(1, runs + 1, BATCH_RUNS):
        batch = range(start, min(start + BATCH_RUNS, runs + 1))
        moment = _write_batch(tenant, batch, moment)
    return Event.objects.count()


# Sorted, compact JSON: RFC 8785 for these payloads (ASCII keys, no floats), checked against
# the real hashing on the template run before anything is written with it.
_compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode


def _fast_hash(body: dict[str, Any]) -> str:
    return sha256(_compact(body).encode()).hexdigest()


def _check_fast_hash(run: Run) -> None:
    for event in Event.objects.filter(run=run).order_by("seq"):
        body = _hash_body(
            event.__dict__
            | {"occurred_at": _iso(event.occurred_at), "recorded_at": _iso(event.recorded_at)}
        )
        if _fast_hash(body) != event.hash or compute_hash(event) != event.hash:
            raise RuntimeError(f"the seed's hashing differs from the log's at {event}")


def _iso(moment: Any) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def _hash_body(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "run": row["run_id"],
        "seq": row["seq"],
        "type": row["event_type"],
        "schema_version": row["schema_version"],
        "producer": row["producer"],
        "tenant": row["tenant_id"],
        "actor": row["actor"],
        "turn_id": row["turn_id"],
        "decision_id": row["decision_id"],
        "capability_id": row["capability_id"],
        "tool_call_id": row["tool_call_id"],
        "approval_id": row["approval_id"],
        "correlation_id": row["correlation_id"],
        "causation_id": row["causation_id"],
        "occurred_at": row["occurred_at"],
        "recorded_at": row["recorded_at"],
        "payload": row["payload"],
        "prev_hash": row["prev_hash"],
    }


def _columns(model: Any) -> list[str]:
    return [f.column for f in model._meta.concrete_fields]


def _write_batch(tenant: Tenant, numbers: range, moment: Any) -> Any:
    runs, decisions, events = [], [], []
    for number in numbers:
        run_id = new_id("run")
        chain = _Chain(run_id, tenant.pk, moment)
        title = f"bench run {number}"
        chain.add(
            "run.started",
            {
                "title": title,
                "correlation_id": run_id,
                "max_tool_calls": 50,
                "max_attempts": 200,
                "deadline": None,
                "metadata": {},
            },
        )
        for step in range(DECISIONS_PER_RUN):
            decision_id, body = new_id("dec"), content(number, step)
            decisions.append(
                {
                    "id": decision_id,
                    "run_id": run_id,
                    "kind": "eligibility",
                    "content": json.dumps(body),
                    "version": 1,
                    "supersedes_id": None,
                    "turn_id": "",
                    "created_at": chain.moment,
                }
            )
            chain.add(
                "decision.recorded",
                {"kind": "eligibility", "version": 1, "content": body, "supersedes": None},
                decision_id=decision_id,
            )
        chain.add("run.completed", {"from": "active", "to": "completed"})
        runs.append(
            {
                "id": run_id,
                "tenant_id": tenant.pk,
                "title": title,
                "correlation_id": run_id,
                "metadata": "{}",
                "state": "completed",
                "max_tool_calls": 50,
                "max_attempts": 200,
                "deadline": None,
                "idempotency_key": "",
                "external_ref": None,
                "request_digest": "",
                "api_key_id": None,
                "created_at": moment,
                "updated_at": chain.moment,
                "ended_at": chain.moment,
                "archived_at": None,
            }
        )
        events += chain.rows
        moment = chain.moment
    with transaction.atomic(), connection.cursor() as cursor:
        for model, rows in ((Run, runs), (Decision, decisions), (Event, events)):
            columns = _columns(model)
            with cursor.copy(
                f"COPY {model._meta.db_table} ({', '.join(columns)}) FROM STDIN"
            ) as copy:
                for row in rows:
                    copy.write_row([row[column] for column in columns])
    return moment


class _Chain:
    def __init__(self, run_id: str, tenant_id: int, moment: Any) -> None:
        self.run_id, self.tenant_id, self.moment = run_id, tenant_id, moment
        self.rows: list[dict[str, Any]] = []

    def add(self, event_type: str, payload: dict[str, Any], decision_id: str = "") -> None:
        self.moment += timedelta(microseconds=7)
        stamp = _iso(self.moment)
        row = {
            "id": new_id("evt"),
            "run_id": self.run_id,
            "seq": len(self.rows) + 1,
            "event_type": event_type,
            "schema_version": 1,
            "producer": "api",
            "tenant_id": self.tenant_id,
            "actor": "bench",
            "turn_id": "",
            "decision_id": decision_id,
            "capability_id": "",
            "tool_call_id": "",
            "approval_id": "",
            "correlation_id": self.run_id,
            "causation_id": "",
            "occurred_at": stamp,
            "recorded_at": stamp,
            "payload": payload,
            "prev_hash": self.rows[-1]["hash"] if self.rows else GENESIS_HASH,
        }
        row["hash"] = _fast_hash(_hash_body(row))
        row["payload"] = json.dumps(payload)
        self.rows.append(row)
