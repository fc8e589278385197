"""Typed facts about a tenant's administration (runs/admin_event_models.py): each type has a
JSON Schema in the registry of runs/events.py, and each is written in the transaction of the
change it records, so a change that rolls back leaves no fact and a fact never lacks its
change.

They are hash-chained per tenant, as run events are per run: each row's hash covers its
content and the previous row's hash, so changing, removing or reordering one breaks the
chain from there (`verify_admin_chain`, run by `manage.py verify_event_chain`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connection
from django.utils import timezone

from runs import events, roundtrip
from runs.admin_event_models import AdminEvent
from runs.models import Tenant, User

# The first argument of the two-key advisory lock that serialises a tenant's admin appends
# (the second is the tenant's id). Any fixed number no other lock uses.
CHAIN_LOCK = 0x41444D  # "ADM"

STR = {"type": "string"}
STRS = {"type": "array", "items": STR}

events.register(
    "user.role_changed",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["from", "to"],
        "properties": {"from": STR, "to": STR},
    },
)
events.register(
    "api_key.issued",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "scopes"],
        "properties": {
            "name": STR,
            "scopes": STRS,
            "principal": STR,
            "expires_at": {"type": ["string", "null"]},
        },
    },
)
events.register(
    "api_key.revoked",
    1,
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["name"],
        "properties": {"name": STR},
    },
)


def admin_event_append(
    *, tenant: Tenant, event_type: str, subject: str, payload: dict[str, Any], by: User
) -> AdminEvent:
    """Record one fact, in the caller's transaction; a payload its schema refuses raises."""
    if not connection.in_atomic_block:
        raise RuntimeError("admin events are written inside the transaction of their change")
    version = events.latest_version(event_type)
    events.validate(event_type, version, payload)
    # One appender per tenant at a time, until this transaction ends: the next seq and the
    # head's hash must be read by one writer only. An advisory lock, not the tenant's row,
    # which the dispatch path locks for every call.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [CHAIN_LOCK, tenant.pk])
    head = AdminEvent.objects.filter(tenant=tenant).order_by("-seq").values("seq", "hash")
    last = head.first()
    event = AdminEvent(
        tenant=tenant,
        event_type=event_type,
        schema_version=version,
        actor=f"user:{by.username}",
        subject=subject,
        payload=roundtrip.rfc8785_roundtrip(payload),
        occurred_at=timezone.now(),
        seq=last["seq"] + 1 if last else 1,
        prev_hash=last["hash"] if last else events.GENESIS_HASH,
    )
    event.hash = admin_event_hash(event)
    event.save(force_insert=True)
    return event


def admin_event_hash(event: AdminEvent) -> str:
    """The hash of everything an admin event says, chained to the tenant's previous one."""
    return events.hash_body(
        {
            "id": event.id,
            "tenant": event.tenant_id,
            "seq": event.seq,
            "type": event.event_type,
            "schema_version": event.schema_version,
            "actor": event.actor,
            "subject": event.subject,
            "occurred_at": events.iso(event.occurred_at),
            "payload": event.payload,
            "prev_hash": event.prev_hash,
        }
    )


def verify_admin_chain(rows: Iterable[AdminEvent] | None = None) -> tuple[list[str], int]:
    """(one line per problem, how many admin events were read), over every tenant's chain in
    (tenant, seq) order, as `runs.chain_check.verify_log` checks the runs' chains."""
    if rows is None:
        rows = AdminEvent.objects.order_by("tenant_id", "seq").iterator(chunk_size=2000)
    problems: list[str] = []
    tenant, expected_seq, expected_prev, count = None, 0, events.GENESIS_HASH, 0
    for event in rows:
        count += 1
        if event.tenant_id != tenant:
            tenant, expected_seq, expected_prev = event.tenant_id, 0, events.GENESIS_HASH
        where = f"admin tenant {event.tenant_id}#{event.seq} ({event.id})"
        if event.seq != expected_seq + 1:
            problems.append(f"{where}: sequence gap, expected #{expected_seq + 1}")
        if event.prev_hash != expected_prev:
            problems.append(f"{where}: prev_hash does not match the previous event's hash")
        try:
            intact = admin_event_hash(event) == event.hash
        except (ValueError, TypeError) as exc:
            problems.append(f"{where}: payload cannot be canonicalised ({type(exc).__name__})")
        else:
            if not intact:
                problems.append(f"{where}: content does not match its hash (changed after writing)")
        expected_seq, expected_prev = event.seq, event.hash
    return problems, count
