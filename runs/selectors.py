"""Reads for pages and the API. Every read of tenant data takes the tenant first."""

from __future__ import annotations

import hmac
from hashlib import sha256

from django.db.models import QuerySet

from runs.errors import not_found
from runs.models import ApiKey, Decision, Event, Run, Tenant


def run_list(*, tenant: Tenant) -> QuerySet[Run]:
    return Run.objects.filter(tenant=tenant).order_by("-id")


def run_get(*, tenant: Tenant, run_id: str) -> Run:
    run = Run.objects.filter(tenant=tenant, pk=run_id).first()
    if run is None:
        raise not_found("run", run_id)
    return run


def run_events(*, run: Run) -> QuerySet[Event]:
    return Event.objects.filter(run=run).order_by("seq")


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
    """The active key that `token` (`<key id>.<secret>`) names, or None."""
    key_id, _, secret = token.partition(".")
    # A NUL cannot be in any key, and PostgreSQL refuses it in a query: no key, not a 500.
    if not key_id.startswith("key_") or not secret or "\x00" in token:
        return None
    key = ApiKey.objects.select_related("tenant", "principal").filter(pk=key_id).first()
    if key is None or not key.is_active:
        return None
    if not hmac.compare_digest(key.secret_hash, hash_secret(secret)):
        return None
    return key
