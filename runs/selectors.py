"""Reads for pages and the API. Every read of tenant data takes the tenant first."""

from __future__ import annotations

import hmac
from datetime import datetime
from hashlib import sha256
from typing import Any, NamedTuple

from django.db import connection
from django.db.models import OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce

from runs import errors, logcontext, sql
from runs.errors import DomainError, not_found
from runs.models import ApiKey, Decision, Event, Run, Tenant


def run_list(*, tenant: Tenant, state: str = "", title: str = "") -> QuerySet[Run]:
    """The tenant's runs, newest first; `state` one of Run.State, `title` a part of it."""
    runs = Run.objects.filter(tenant=tenant)
    if state:
        runs = runs.filter(state=state)
    if title:
        runs = runs.filter(title__icontains=title)
    return runs.order_by("-id")


def run_for_page(*, tenant: Tenant, run_id: str) -> Run:
    """The run for its console page, with its API key and the key's person (the page names
    them) and, as `last_seq`, the sequence number of its latest event (0 before any): one
    query, which is all a poll of an unchanged run reads besides the person."""
    if connection.vendor == "postgresql":
        run = sql.run_for_page(tenant.pk, run_id)  # the same read, written out
    else:
        run = run_for_page_orm(tenant=tenant, run_id=run_id)
    if run is None:
        raise not_found("run", run_id)
    logcontext.bind(run_id=run.pk, correlation_id=run.correlation_id)  # for logs and spans
    return run


def run_for_page_orm(*, tenant: Tenant, run_id: str) -> Run | None:
    last_seq = Event.objects.filter(run=OuterRef("pk")).order_by("-seq").values("seq")[:1]
    return (
        Run.objects.select_related("api_key__principal")
        .annotate(last_seq=Coalesce(Subquery(last_seq), 0))
        .filter(tenant=tenant, pk=run_id)
        .first()
    )


def run_get(*, tenant: Tenant, run_id: str) -> Run:
    run = Run.objects.filter(tenant=tenant, pk=run_id).first()
    if run is None:
        raise not_found("run", run_id)
    logcontext.bind(run_id=run.pk, correlation_id=run.correlation_id)  # for logs and spans
    return run


def run_events(*, run: Run) -> QuerySet[Event]:
    return Event.objects.filter(run=run).order_by("seq")


class TimelineEvent(NamedTuple):
    """The columns of an event the run page's timeline shows."""

    id: str
    seq: int
    event_type: str
    occurred_at: datetime
    actor: str
    producer: str
    tool_call_id: str
    causation_id: str
    payload: Any


def run_events_window(*, run: Run, size: int, before: int | None = None) -> list[TimelineEvent]:
    """The run's latest `size` events before sequence number `before` (all: None), oldest
    first: one range of the (run, seq) index, however long the run. Read as values: a page
    shows them and builds no Event objects."""
    if connection.vendor == "postgresql":
        rows = sql.timeline_window(run.pk, size, before)  # the same read, written out
    else:
        events = Event.objects.filter(run=run)
        if before is not None:
            events = events.filter(seq__lt=before)
        rows = list(events.order_by("-seq").values_list(*TimelineEvent._fields)[:size])
    return [TimelineEvent(*row) for row in reversed(rows)]


def run_decisions(*, run: Run) -> QuerySet[Decision]:
    return Decision.objects.filter(run=run).order_by("id")


def decision_get(*, run: Run, decision_id: str) -> Decision:
    decision = Decision.objects.filter(run=run, pk=decision_id).first()
    if decision is None:
        raise not_found("decision", decision_id)
    return decision


def hash_secret(secret: str) -> str:
    # API key secrets are 256 random bits: a fast hash is enough, no stretching needed.
    return sha256(secret.encode()).hexdigest()


def api_key_authenticate(token: str) -> ApiKey | None:
    """The active key that `token` (`<key id>.<secret>`) names, or None. The holder of an
    expired key's secret is told it expired (401), so they know to ask for a new one."""
    key_id, _, secret = token.partition(".")
    # A NUL cannot be in any key, and PostgreSQL refuses it in a query: no key, not a 500.
    if not key_id.startswith("key_") or not secret or "\x00" in token:
        return None
    key = sql.api_key_read(key_id)  # with its tenant and principal
    if key is None or key.revoked_at is not None:
        return None
    if not hmac.compare_digest(key.secret_hash, hash_secret(secret)):
        return None
    if key.is_expired:
        raise DomainError(
            errors.AUTH_UNAUTHENTICATED,
            f"API key {key.pk} expired at {key.expires_at.isoformat()}; ask an admin of the "
            "tenant for a new key.",
            status=401,
        )
    return key
