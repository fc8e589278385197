"""Agent API for runs and decisions."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from ninja import Field, Header, Router, Schema, Status
from pydantic import ConfigDict, field_validator

from runs import credentials, selectors, services
from runs.models import Decision, Run

router = Router(tags=["runs"])


class StrictSchema(Schema):
    # Unknown fields are an error, not something silently dropped.
    model_config = ConfigDict(extra="forbid")


ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def iso_time_only(value: Any) -> Any:
    """A time is an ISO 8601 string, as the document says (`format: date-time`): pydantic
    would also read a number, or a string of digits, as Unix seconds (`9` is 1970)."""
    if value is not None and not (isinstance(value, str) and ISO_DATE.match(value)):
        raise ValueError("must be an ISO 8601 time such as 2030-01-31T12:00:00Z")
    return value


class RunIn(StrictSchema):
    title: str = Field(..., min_length=1, max_length=200)
    correlation_id: str = Field("", max_length=200)
    max_tool_calls: int = Field(50, ge=1, le=10_000)
    max_attempts: int = Field(200, ge=1, le=100_000)
    deadline: datetime | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    # The agent framework's thread or conversation id: starting a run with one that exists
    # answers 200 with that run (409 with another body), like an Idempotency-Key.
    external_ref: str | None = Field(None, min_length=1, max_length=200)

    _deadline_is_iso = field_validator("deadline", mode="before")(iso_time_only)

    @field_validator("deadline")
    @classmethod
    def deadline_in_the_future(cls, deadline: datetime | None) -> datetime | None:
        if deadline is None:
            return None
        if deadline.tzinfo is None:
            deadline = deadline.replace(tzinfo=UTC)  # as run_start reads it (TIME_ZONE)
        try:
            deadline = deadline.astimezone(UTC)
        except OverflowError:  # 9999-12-31T23:59:59-23:59 is in the year 10000 in UTC
            raise ValueError("is out of range: it must be before the year 10000 in UTC") from None
        # A deadline already past (`0` is 1970) would end the run before its first call.
        if deadline <= timezone.now():
            raise ValueError("must be in the future (an ISO 8601 time with its offset)")
        return deadline


class RunOut(Schema):
    run_id: str
    title: str
    state: str
    correlation_id: str
    external_ref: str | None
    max_tool_calls: int
    max_attempts: int
    deadline: datetime | None
    metadata: dict[str, Any]
    created_at: datetime
    updated_at: datetime


class DecisionIn(StrictSchema):
    kind: str = Field(..., min_length=1, max_length=100)
    content: dict[str, Any]
    supersedes: str | None = Field(None, max_length=40)
    turn_id: str = Field("", max_length=100)


class DecisionOut(Schema):
    decision_id: str
    run_id: str
    kind: str
    version: int
    content: dict[str, Any]
    supersedes: str | None
    created_at: datetime


class ErrorBody(Schema):
    name: str
    message: str
    details: list[dict[str, Any]]


class ErrorOut(Schema):
    error: ErrorBody


ERRORS = {
    400: ErrorOut,
    401: ErrorOut,
    403: ErrorOut,
    404: ErrorOut,
    409: ErrorOut,
    413: ErrorOut,
    415: ErrorOut,
    422: ErrorOut,
    503: ErrorOut,
}


def run_out(run: Run) -> dict[str, Any]:
    return {
        "run_id": run.pk,
        "title": run.title,
        "state": run.state,
        "correlation_id": run.correlation_id,
        "external_ref": run.external_ref,
        "max_tool_calls": run.max_tool_calls,
        "max_attempts": run.max_attempts,
        "deadline": run.deadline,
        "metadata": run.metadata,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
    }


def decision_out(decision: Decision) -> dict[str, Any]:
    return {
        "decision_id": decision.pk,
        "run_id": decision.run_id,
        "kind": decision.kind,
        "version": decision.version,
        "content": decision.content,
        "supersedes": decision.supersedes_id,
        "created_at": decision.created_at,
    }


@router.post("/runs", response={200: RunOut, 201: RunOut, **ERRORS})
def start_run(
    request: HttpRequest,
    payload: RunIn,
    response: HttpResponse,
    idempotency_key: str | None = Header(None, alias="Idempotency-Key", max_length=200),
) -> Status:
    """Start a run. With an `Idempotency-Key` header, or an `external_ref` (the framework's
    thread or conversation id), asking again returns the same run (200,
    `Idempotent-Replayed: true`); the same key or ref with another body is 409
    `idempotency.conflict`."""
    run, created = services.run_start(
        tenant=request.auth.tenant,
        actor=services.actor_for_key(request.auth),
        api_key=request.auth,
        idempotency_key=idempotency_key or "",
        **payload.dict(),
    )
    if not created:
        response["Idempotent-Replayed"] = "true"
    return Status(201 if created else 200, run_out(run))


@router.get("/runs/{run_id}", response={200: RunOut, **ERRORS})
def get_run(request: HttpRequest, run_id: str) -> dict[str, Any]:
    return run_out(selectors.run_get(tenant=request.auth.tenant, run_id=run_id))


@router.post("/runs/{run_id}/decisions", response={201: DecisionOut, **ERRORS})
def record_decision(request: HttpRequest, run_id: str, payload: DecisionIn) -> Status:
    """Record a business judgment (e.g. `refund_eligibility`); tool calls cite its id."""
    decision = services.decision_record(
        tenant=request.auth.tenant,
        run_id=run_id,
        kind=payload.kind,
        content=payload.content,
        supersedes_id=payload.supersedes,
        turn_id=payload.turn_id,
        actor=services.actor_for_key(request.auth),
    )
    return Status(201, decision_out(decision))


class CredentialIn(StrictSchema):
    # Capped by RUN_CREDENTIAL_MAX_TTL_SECONDS (3600 by default) and the key's own expiry.
    ttl_s: int = Field(..., ge=1, le=30 * 24 * 3600)
    # Within the key's scopes; the key's own scopes when left out.
    scopes: list[str] | None = Field(None, max_length=100)


class CredentialOut(Schema):
    credential_id: str
    run_id: str
    # `Authorization: Bearer <token>`; shown this once, only its hash is stored.
    token: str
    scopes: list[str]
    expires_at: datetime
    created_at: datetime


@router.post("/runs/{run_id}/credentials", response={201: CredentialOut, **ERRORS})
def mint_credential(request: HttpRequest, run_id: str, payload: CredentialIn) -> Status:
    """Mint a run-scoped credential: a bearer token that acts for this key on this run only
    (its endpoints and its tool calls), with scopes within the key's, until `ttl_s` passes
    (at most RUN_CREDENTIAL_MAX_TTL_SECONDS, and not past the key's expiry) or the run ends.
    Elsewhere it is 403 `auth.credential_run_bound`; expired, 401 `auth.credential_expired`;
    after the run's end, 401 `auth.credential_revoked`."""
    credential, token = credentials.credential_mint(
        api_key=request.auth,
        run_id=run_id,
        ttl_s=payload.ttl_s,
        scopes_asked=payload.scopes,
        actor=services.actor_for_key(request.auth),
    )
    return Status(
        201,
        {
            "credential_id": credential.pk,
            "run_id": credential.run_id,
            "token": token,
            "scopes": credential.scopes,
            "expires_at": credential.expires_at,
            "created_at": credential.created_at,
        },
    )
