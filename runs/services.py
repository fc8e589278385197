"""Writes that change runs, decisions, tenants, people and keys.

Each state change locks its row, makes the change, appends its event and saves in one
transaction; nothing here sets a state field by hand.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction

from runs import errors, events, logcontext, run_end, transitions
from runs.admin_events import admin_event_append
from runs.canonical import digest
from runs.errors import DomainError, not_found
from runs.event_types import RUN_TRANSITION_EVENTS
from runs.models import ApiKey, Decision, Run, Tenant, User
from runs.scopes import scope_problem
from runs.selectors import hash_secret


def actor_for_user(user: User) -> str:
    return f"user:{user.username}"


def actor_for_key(api_key: ApiKey) -> str:
    return f"api_key:{api_key.pk}"


# --- tenants, people, keys ------------------------------------------------------------------


def tenant_create(*, slug: str, name: str) -> Tenant:
    if Tenant.objects.filter(slug=slug).exists():
        raise DomainError(errors.TENANT_EXISTS, f"Tenant {slug!r} exists already.")
    return Tenant.objects.create(slug=slug, name=name)


def user_create(
    *, username: str, tenant: Tenant, role: str, password: str, email: str = ""
) -> User:
    if role not in User.Role.values:
        raise DomainError(
            errors.USER_INVALID_ROLE, f"Role must be one of {', '.join(User.Role.values)}."
        )
    if User.objects.filter(username=username).exists():
        raise DomainError(errors.USER_EXISTS, f"User {username!r} exists already.")
    return User.objects.create_user(
        username=username, password=password, email=email, tenant=tenant, role=role
    )


def api_key_issue(
    *,
    tenant: Tenant,
    name: str,
    scopes: Sequence[str],
    principal: User | None = None,
    expires_at: datetime | None = None,
    by: User | None = None,
) -> tuple[ApiKey, str]:
    """Create a key and return it with its token, which is never shown again. `scopes` are
    what it may propose (runs/scopes.py; `["*"]` for everything, `[]` for nothing). An
    admin's key (`by`) is recorded as an `api_key.issued` admin event with it."""
    scopes = list(dict.fromkeys(scopes))  # each once, in the order given
    problems = [problem for scope in scopes if (problem := scope_problem(scope))]
    if problems:
        raise DomainError(errors.API_KEY_INVALID_SCOPE, " ".join(problems), status=422)
    if expires_at is not None and expires_at <= datetime.now(UTC):
        raise DomainError(
            errors.API_KEY_INVALID_EXPIRY,
            f"The expiry {expires_at.isoformat()} has passed; give a time in the future.",
            status=422,
        )
    secret = secrets.token_urlsafe(32)
    with transaction.atomic():
        key = ApiKey.objects.create(
            tenant=tenant,
            name=name,
            principal=principal,
            scopes=scopes,
            expires_at=expires_at,
            secret_hash=hash_secret(secret),
        )
        if by is not None:
            admin_event_append(
                tenant=tenant,
                event_type="api_key.issued",
                subject=f"api_key:{key.pk}",
                payload={
                    "name": name,
                    "scopes": scopes,
                    "principal": principal.username if principal else "",
                    "expires_at": expires_at.isoformat() if expires_at else None,
                },
                by=by,
            )
    return key, f"{key.pk}.{secret}"


def api_key_revoke(*, api_key: ApiKey, by: User | None = None) -> ApiKey:
    """Refuse the key from now on. An admin's revocation (`by`) is recorded as an
    `api_key.revoked` admin event in the same transaction; revoking twice records once."""
    with transaction.atomic():
        revoked = ApiKey.objects.filter(pk=api_key.pk, revoked_at=None).update(
            revoked_at=datetime.now(UTC)
        )
        if revoked and by is not None:
            admin_event_append(
                tenant=api_key.tenant,
                event_type="api_key.revoked",
                subject=f"api_key:{api_key.pk}",
                payload={"name": api_key.name},
                by=by,
            )
    api_key.refresh_from_db(fields=["revoked_at"])
    return api_key


# How stale `last_used_at` may be: one write a minute per key at most, not one per request.
KEY_USE_RESOLUTION = timedelta(minutes=1)


def api_key_mark_used(api_key: ApiKey) -> None:
    now = datetime.now(UTC)
    if api_key.last_used_at is not None and now - api_key.last_used_at < KEY_USE_RESOLUTION:
        return  # recorded recently enough: no query at all
    ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
    api_key.last_used_at = now


def user_change_role(*, tenant: Tenant, username: str, role: str, by: User) -> User:
    """Give a person of `tenant` another role, recorded as a `user.role_changed` admin event in
    the same transaction. An admin cannot take their own admin role away: a tenant is never
    left with nobody to manage it by the person managing it."""
    if role not in User.Role.values:
        raise DomainError(
            errors.USER_INVALID_ROLE, f"Role must be one of {', '.join(User.Role.values)}."
        )
    with transaction.atomic():
        person = User.objects.select_for_update().filter(tenant=tenant, username=username).first()
        if person is None:
            raise not_found("person", username)
        if person.pk == by.pk and role != User.Role.ADMIN:
            raise DomainError(
                errors.USER_OWN_ROLE,
                "You cannot take away your own admin role; ask another admin of the tenant.",
            )
        if person.role == role:
            return person
        admin_event_append(
            tenant=tenant,
            event_type="user.role_changed",
            subject=f"user:{person.username}",
            payload={"from": person.role, "to": role},
            by=by,
        )
        person.role = role
        person.save(update_fields=["role"])
    return person


# --- runs -----------------------------------------------------------------------------------


def _lock_run(*, tenant: Tenant, run_id: str) -> Run:
    run = Run.objects.select_for_update().filter(tenant=tenant, pk=run_id).first()
    if run is None:
        raise not_found("run", run_id)
    return run


def run_start(
    *,
    tenant: Tenant,
    title: str,
    actor: str,
    correlation_id: str = "",
    max_tool_calls: int = 50,
    max_attempts: int = 200,
    deadline: datetime | None = None,
    metadata: dict[str, Any] | None = None,
    idempotency_key: str = "",
    external_ref: str | None = None,
    api_key: ApiKey | None = None,
) -> tuple[Run, bool]:
    """Start a run. With an idempotency key, or an external ref (the framework's thread or
    conversation id), asking again returns the first run (created=False); the same key or
    ref with another body is a conflict."""
    deadline = deadline.astimezone(UTC) if deadline else None
    metadata = metadata or {}
    request = {
        "title": title,
        "correlation_id": correlation_id,
        "max_tool_calls": max_tool_calls,
        "max_attempts": max_attempts,
        "deadline": deadline.isoformat() if deadline else None,
        "metadata": metadata,
    }
    if external_ref is not None:
        # Only when given: the digests of runs started without one stay what they were.
        request["external_ref"] = external_ref
    request_digest = digest(request)
    existing = _existing_run(tenant, idempotency_key, external_ref)
    if existing:
        return _same_request(existing, request_digest), False
    try:
        with transaction.atomic():
            run = _run_insert(
                request,
                actor=actor,
                tenant=tenant,
                title=title,
                metadata=metadata,
                max_tool_calls=max_tool_calls,
                max_attempts=max_attempts,
                deadline=deadline,
                idempotency_key=idempotency_key,
                external_ref=external_ref,
                request_digest=request_digest,
                api_key=api_key,
            )
    except IntegrityError:
        # A concurrent request with the same key or ref committed first: answer with its run.
        existing = _existing_run(tenant, idempotency_key, external_ref)
        if existing is None:
            raise
        return _same_request(existing, request_digest), False
    return run, True


def _run_insert(request: dict[str, Any], *, actor: str, **fields: Any) -> Run:
    run = Run(**fields)
    # Without one from the agent, the run's own id correlates everything it causes.
    run.correlation_id = request["correlation_id"] or run.pk
    run.save(force_insert=True)
    logcontext.bind(run_id=run.pk, correlation_id=run.correlation_id)
    events.append(
        run=run,
        event_type="run.started",
        payload={**request, "correlation_id": run.correlation_id},
        producer="api",
        actor=actor,
    )
    return run


def _existing_run(tenant: Tenant, idempotency_key: str, external_ref: str | None) -> Run | None:
    if idempotency_key:
        existing = Run.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
        if existing:
            return existing
    if external_ref is not None:
        return Run.objects.filter(tenant=tenant, external_ref=external_ref).first()
    return None


def _same_request(run: Run, request_digest: str) -> Run:
    if run.request_digest != request_digest:
        raise DomainError(
            errors.IDEMPOTENCY_CONFLICT,
            f"Run {run.pk} was started with this Idempotency-Key or external_ref and a "
            "different body; use a new key (or ref) for a new run.",
        )
    return run


# The transitions whose target is terminal (Run.TERMINAL_STATES).
TERMINAL_ACTIONS = ("complete", "complete_with_degradation", "fail_permanently", "cancel")


def run_transition(run: Run, action: str, *, actor: str, reason: str = "", producer: str) -> Run:
    """Apply one Run transition, log it and save the run (runs.transitions has the contract).
    The run's lifecycle rules (when to wait, resume, finish) are in toolcalls/lifecycle.py.
    A transition into a terminal state also runs the run's end cleanup (runs/run_end.py),
    in the same transaction."""
    if action in TERMINAL_ACTIONS:
        run.ended_at = datetime.now(UTC)
    transitions.apply(
        run,
        action,
        field="state",
        event_type=RUN_TRANSITION_EVENTS[action],
        run=run,
        actor=actor,
        producer=producer,
        reason=reason,
        refusal=errors.RUN_INVALID_STATE,
    )
    if run.state in Run.TERMINAL_STATES:
        run_end.run_ended(run=run, actor=actor, producer=producer)
    return run


@transaction.atomic
def decision_record(
    *,
    tenant: Tenant,
    run_id: str,
    kind: str,
    content: dict[str, Any],
    actor: str,
    supersedes_id: str | None = None,
    turn_id: str = "",
) -> Decision:
    run = _lock_run(tenant=tenant, run_id=run_id)
    if not run.is_open:
        raise DomainError(
            errors.RUN_CLOSED, f"Run {run.pk} is {run.state}; it takes no new decisions."
        )
    version = 1
    supersedes = None
    if supersedes_id:
        supersedes = Decision.objects.filter(run=run, pk=supersedes_id).first()
        if supersedes is None:
            raise DomainError(
                errors.DECISION_NOT_FOUND,
                f"supersedes names {supersedes_id!r}, which is not a decision of this run.",
                status=422,
            )
        if supersedes.kind != kind:
            raise DomainError(
                errors.DECISION_KIND_MISMATCH,
                f"Decision {supersedes_id} is of kind {supersedes.kind!r}, not {kind!r}.",
                status=422,
            )
        if Decision.objects.filter(supersedes=supersedes).exists():
            raise DomainError(
                errors.DECISION_ALREADY_SUPERSEDED,
                f"Decision {supersedes_id} is superseded already; supersede its latest version.",
            )
        version = supersedes.version + 1
    decision = Decision.objects.create(
        run=run, kind=kind, content=content, version=version, supersedes=supersedes, turn_id=turn_id
    )
    events.append(
        run=run,
        event_type="decision.recorded",
        payload={
            "kind": kind,
            "version": version,
            "content": content,
            "supersedes": supersedes_id or None,
        },
        producer="api",
        actor=actor,
        ids=events.Ids(decision_id=decision.pk, turn_id=turn_id),
    )
    return decision
