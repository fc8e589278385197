"""The audit trail: a tenant's events found by any id, a person, a type or a time range, and
exported as JSON Lines. Reads only; every read takes the tenant first.

Admin events (a policy published, a role changed, a key issued or revoked: their own table,
runs/admin_event_models.py) are listed among the run events, newest first, by the same
filters. Pages and export chunks are cut by the run events' keyset cursor; each admin event
goes with the page whose time span holds it (`admin_events_of_span`), so none is shown twice or
skipped, and the cursor stays the run events' own."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time
from typing import Any, TypeVar

from django.db.models import BooleanField, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.functions import Upper
from django.utils import timezone

from runs.actors import ACTOR_KINDS, ActorPerson, person_of
from runs.models import AdminEvent, Event, Tenant

# The ids an event carries in its own columns (DESIGN section 1), then those its payload names:
# a support person may hold only the refund id the payment system gave the customer.
ID_FIELDS = (
    "id",
    "run_id",
    "tool_call_id",
    "approval_id",
    "decision_id",
    "capability_id",
    "correlation_id",
    "causation_id",
    "turn_id",
)
PAYLOAD_ID_KEYS = ("attempt_id", "receipt_id", "external_id")

# What an admin event's subject names before its colon (runs/admin_event_models.py).
SUBJECT_KINDS = ("policy", "user", "api_key")
# At most this many admin events with one page (their whole table when no run event matches).
ADMIN_ROWS = 500

# Rows an export reads at a time (its first read is smaller).
EXPORT_CHUNK_SIZE = 2000
EXPORT_FIRST_CHUNK = 50


@dataclass(frozen=True)
class AuditQuery:
    any_id: str = ""
    person: str = ""
    event_type: str = ""
    occurred_from: datetime | None = None
    occurred_to: datetime | None = None
    # Where this page starts: (occurred_at, run_id, seq) of the last event of the page before.
    before: tuple[datetime, str, int] | None = None


def parse_moment(text: str, *, end_of_day: bool = False) -> datetime:
    """An ISO 8601 date or date-time. A bare date means the start of that day (or its last
    moment, for the end of a range); without an offset, the time is in TIME_ZONE."""
    try:
        day = date.fromisoformat(text)
    except ValueError:
        moment = datetime.fromisoformat(text)  # a ValueError here is the caller's to report
    else:
        moment = datetime.combine(day, time.max if end_of_day else time.min)
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment)
    return moment


def audit_query_from(params: Mapping[str, str]) -> tuple[AuditQuery, dict[str, str]]:
    """The search a page's GET parameters ask for, and a message per parameter it cannot read."""
    errors: dict[str, str] = {}
    moments: dict[str, datetime | None] = {"from": None, "to": None}
    for name in moments:
        text = params.get(name, "").strip()
        if not text:
            continue
        try:
            moments[name] = parse_moment(text, end_of_day=name == "to")
        except ValueError:
            errors[name] = (
                f"“{text}” is not an ISO 8601 date or date-time, such as 2025-01-31 or "
                "2025-01-31T09:30:00Z."
            )
    before = None
    if text := params.get("before", "").strip():
        try:
            before = parse_cursor(text)
        except ValueError:
            errors["before"] = "This page link is damaged: start again from the newest events."
    query = AuditQuery(
        before=before,
        any_id=params.get("q", "").strip(),
        person=params.get("person", "").strip(),
        event_type=params.get("type", "").strip(),
        occurred_from=moments["from"],
        occurred_to=moments["to"],
    )
    return query, errors


Rows = TypeVar("Rows", QuerySet[Event], QuerySet[AdminEvent])


def audit_events(*, tenant: Tenant, query: AuditQuery) -> QuerySet[Event]:
    """The tenant's events that match every part of the query, newest first."""
    events = Event.objects.filter(tenant=tenant)
    if query.any_id:
        matches = Q()
        for field in ID_FIELDS:
            matches |= Q(**{field: query.any_id})
        for key in PAYLOAD_ID_KEYS:
            matches |= Q(**{f"payload__{key}": query.any_id})
        events = events.filter(matches)
    events = _person_type_and_time(events, query)
    if query.before is not None:
        # Keyset paging: the rows after the last one shown, in the order of the index
        # (tenant, occurred_at, run, seq); no OFFSET to skip and no COUNT(*) per page.
        events = events.filter(
            RawSQL(
                '("runs_event"."occurred_at", "runs_event"."run_id", "runs_event"."seq") '
                "< (%s, %s, %s)",
                query.before,
                output_field=BooleanField(),
            )
        )
    return events.order_by("-occurred_at", "-run_id", "-seq")


def audit_admin_events(*, tenant: Tenant, query: AuditQuery) -> QuerySet[AdminEvent]:
    """The tenant's admin events that match the query's id, person, type and time range:
    an id is the event's own or what it changed ("key_…", "alice", a capability)."""
    admin = AdminEvent.objects.filter(tenant=tenant)
    if query.any_id:
        subjects = [query.any_id, *(f"{kind}:{query.any_id}" for kind in SUBJECT_KINDS)]
        admin = admin.filter(Q(id=query.any_id) | Q(subject__in=subjects))
    return _person_type_and_time(admin, query).order_by("-occurred_at", "-id")


def _person_type_and_time(rows: Rows, query: AuditQuery) -> Rows:
    """The filters run events and admin events share (both have actor, event_type and
    occurred_at)."""
    if query.person:
        # "alice" finds "user:alice", "key_…" finds "api_key:key_…"; a whole actor finds itself.
        # Never a part of a name: "ali" must not find alice.
        person = query.person.upper()
        actors = [person, *(f"{kind}:{person}" for kind in ACTOR_KINDS)]
        persons = sorted({person_of(actor) for actor in actors})
        if rows.model is Event:
            # The event_person index: a bare name is one value of it, whose events it holds
            # newest first, so a page reads 101 entries, not all of that person's events.
            rows = rows.alias(person=ActorPerson()).filter(person__in=persons)
        if len(persons) > 1 or rows.model is not Event:
            # "user:alice" is two persons ("alice" of "user:alice", "user:alice" of
            # "system:user:alice"): keep the actors it names. (For a bare name the persons
            # filter is exactly these actors; saying it twice would fool the planner.)
            rows = rows.alias(actor_upper=Upper("actor")).filter(actor_upper__in=actors)
    if query.event_type:
        # "approval." and "approval" both mean every approval.* type.
        prefix = query.event_type.rstrip(".*") + "."
        rows = rows.filter(Q(event_type=query.event_type) | Q(event_type__startswith=prefix))
    if query.occurred_from:
        rows = rows.filter(occurred_at__gte=query.occurred_from)
    if query.occurred_to:
        rows = rows.filter(occurred_at__lte=query.occurred_to)
    return rows


def admin_events_of_span(
    *, tenant: Tenant, query: AuditQuery, last_shown: datetime | None
) -> list[AdminEvent]:
    """The admin events of a page's time span, newest first. The span runs from the page
    before's last event (exclusive) down to this page's last event `last_shown`, or to the
    beginning on the last page (None): consecutive pages' spans meet without overlapping."""
    admin = audit_admin_events(tenant=tenant, query=query)
    if query.before is not None:
        admin = admin.filter(occurred_at__lt=query.before[0])
    if last_shown is not None:
        admin = admin.filter(occurred_at__gte=last_shown)
    return list(admin[:ADMIN_ROWS])


def with_admin_events(
    *, tenant: Tenant, query: AuditQuery, events: list[Event], last_page: bool
) -> list[Event | AdminEvent]:
    """A page of run events with the admin events of its time span, newest first."""
    last_shown = events[-1].occurred_at if events and not last_page else None
    admin = admin_events_of_span(tenant=tenant, query=query, last_shown=last_shown)
    rows: list[Event | AdminEvent] = [*events, *admin]
    # A stable sort: run events keep their (run, seq) order within the same instant.
    return sorted(rows, key=lambda row: row.occurred_at, reverse=True)


def cursor_of(event: Event) -> str:
    """Where the next (older) page starts: after this event, in the audit's order."""
    return cursor_at(event.occurred_at, event.run_id, event.seq)


def cursor_at(occurred_at: datetime, run_id: str, seq: int) -> str:
    return f"{_iso(occurred_at)}~{run_id}~{seq}"


def parse_cursor(text: str) -> tuple[datetime, str, int]:
    """The cursor `cursor_of` wrote; ValueError for anything else."""
    moment, run_id, seq = text.split("~")
    occurred = datetime.fromisoformat(moment)
    if timezone.is_naive(occurred) or not run_id.startswith("run_"):
        raise ValueError(text)
    return occurred, run_id, int(seq)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def event_record(event: Event) -> dict[str, Any]:
    """Every stored field of an event, under its column name, times in ISO 8601 UTC."""
    record: dict[str, Any] = {}
    for field in Event._meta.concrete_fields:
        value = getattr(event, field.attname)
        record[field.attname] = _iso(value) if isinstance(value, datetime) else value
    return record


def admin_event_record(event: AdminEvent) -> dict[str, Any]:
    """Every stored field of an admin event, under its column name, and `"log": "admin"`:
    these lines have no run, and name what changed in `subject`."""
    record: dict[str, Any] = {"log": "admin"}
    for field in AdminEvent._meta.concrete_fields:
        value = getattr(event, field.attname)
        record[field.attname] = _iso(value) if isinstance(value, datetime) else value
    return record


def audit_jsonl(*, tenant: Tenant, query: AuditQuery) -> Iterator[str]:
    """One JSON object per line, read a chunk at a time with the page's keyset cursor: memory
    stays constant, the first line comes after one short query, and no transaction or cursor
    stays open while the client reads. (A server-side cursor outside a transaction is WITH
    HOLD, and PostgreSQL computes all of it before the first row.)"""
    # A small first chunk, so the first line leaves soon; then bigger ones, fewer queries.
    size = min(EXPORT_FIRST_CHUNK, EXPORT_CHUNK_SIZE)
    while True:
        chunk = list(audit_events(tenant=tenant, query=query)[:size])
        last_chunk = len(chunk) < size
        for row in with_admin_events(
            tenant=tenant, query=query, events=chunk, last_page=last_chunk
        ):
            record = admin_event_record(row) if isinstance(row, AdminEvent) else event_record(row)
            yield json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
        if last_chunk:
            return
        size = min(size * 4, EXPORT_CHUNK_SIZE)
        last = chunk[-1]
        query = replace(query, before=(last.occurred_at, last.run_id, last.seq))
