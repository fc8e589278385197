"""Agent API for run memory: checkpoints, the resume contract, feedback facts, eval traces."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest, StreamingHttpResponse
from ninja import Field, Path, Query, Router, Schema, Status
from pydantic import model_validator

from memory import checkpoints, errors, eval_trace, feedback, resume, schemas
from memory.models import Feedback
from runs import selectors as run_selectors
from runs.api import ERRORS, ErrorOut, StrictSchema
from runs.errors import DomainError
from runs.services import actor_for_key

router = Router(tags=["run memory"])

NAME = r"^[A-Za-z0-9._:-]+$"
CHECKPOINT_NAME = Path(..., min_length=1, max_length=100, pattern=NAME)


class CheckpointIn(StrictSchema):
    schema_version: int = Field(..., ge=1, le=1_000_000)
    # The schema family its migrations are registered under; the checkpoint's name if empty.
    kind: str = Field("", max_length=100, pattern=r"^([A-Za-z0-9._:-]+)?$")
    state: str = Field(..., min_length=1, max_length=100)
    step_index: int = Field(..., ge=0)
    input: dict[str, Any] = Field(default_factory=dict)
    decision_ids: list[str] = Field(default_factory=list, max_length=1000)
    tool_call_ids: list[str] = Field(default_factory=list, max_length=1000)
    budgets: dict[str, int | float] = Field(default_factory=dict)
    data: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def no_chain_of_thought(cls, values: Any) -> Any:
        # Before the unknown-field check, so a `reasoning` field is told why it is refused.
        schemas.refuse_chain_of_thought(values)
        return values


# A checkpoint is answered as a plain object: its ids (checkpoint_id, run_id, name, kind,
# version, schema_version, written_schema_version, created_at) beside the body's fields —
# state, step_index, input, decision_ids, tool_call_ids, budgets, data — and any field a
# migration added, which a declared schema would drop.
CheckpointOut = dict[str, Any]


class CheckpointVersionOut(Schema):
    checkpoint_id: str
    name: str
    kind: str
    version: int
    schema_version: int
    size_bytes: int
    body_digest: str
    created_at: datetime
    archived_at: datetime | None


class ReadQuery(Schema):
    # The schema version to read at (default: the latest registered for the kind).
    schema_version: int | None = Field(None, ge=1)
    # An older version of the checkpoint (default: the latest).
    version: int | None = Field(None, ge=1)


@router.put(
    "/runs/{run_id}/checkpoints/{name}",
    response={200: CheckpointOut, 201: CheckpointOut, **ERRORS},
)
def put_checkpoint(
    request: HttpRequest, run_id: str, payload: CheckpointIn, name: str = CHECKPOINT_NAME
) -> Status:
    """Write a new version of checkpoint `name` (201). The same body again answers the
    latest version (200): a retried PUT adds nothing. Chain-of-thought is refused (422
    `checkpoint.chain_of_thought_refused`); over CHECKPOINT_MAX_BYTES, 413
    `checkpoint.too_large`."""
    body = payload.dict(exclude={"schema_version", "kind"})
    checkpoint, created = checkpoints.checkpoint_save(
        tenant=request.auth.tenant,
        run_id=run_id,
        name=name,
        kind=payload.kind or name,
        schema_version=payload.schema_version,
        body=body,
        actor=actor_for_key(request.auth),
    )
    return Status(201 if created else 200, checkpoints.checkpoint_out(checkpoint))


@router.get("/runs/{run_id}/checkpoints/{name}", response={200: CheckpointOut, **ERRORS})
def get_checkpoint(
    request: HttpRequest, run_id: str, name: str, query: Query[ReadQuery]
) -> dict[str, Any]:
    """The latest version (or `?version=N`), migrated to the latest schema registered for its
    kind (or `?schema_version=N`); 409 `checkpoint.no_migration_path` when there is no way."""
    run = run_selectors.run_get(tenant=request.auth.tenant, run_id=run_id)
    checkpoint = checkpoints.checkpoint_get(run=run, name=name, version=query.version)
    return checkpoints.checkpoint_out(checkpoint, schema_version=query.schema_version)


@router.get(
    "/runs/{run_id}/checkpoints/{name}/versions",
    response={200: list[CheckpointVersionOut], **ERRORS},
)
def list_checkpoint_versions(request: HttpRequest, run_id: str, name: str) -> list[dict]:
    """Every version of the checkpoint, oldest first (ids, numbers, sizes; not bodies)."""
    run = run_selectors.run_get(tenant=request.auth.tenant, run_id=run_id)
    versions = checkpoints.checkpoint_versions(run=run, name=name)
    found = [checkpoints.checkpoint_summary(checkpoint) for checkpoint in versions]
    if not found:
        checkpoints.checkpoint_get(run=run, name=name)  # 404 in the API's shape
    return found


@router.get("/runs/{run_id}/resume", response={200: dict[str, Any], **ERRORS})
def get_resume(request: HttpRequest, run_id: str) -> dict[str, Any]:
    """The resume contract: latest checkpoints (migrated), progress, receipts, unknown calls
    (never to be sent again by the agent), pending approvals with their URLs, and what the
    runtime checks again before anything is sent."""
    run = run_selectors.run_get(tenant=request.auth.tenant, run_id=run_id)
    return resume.resume_contract(run=run, api_key=request.auth)


# --- feedback facts -------------------------------------------------------------------------


class FeedbackIn(StrictSchema):
    # What it is about: at most one of these; none means the run itself.
    decision_id: str | None = Field(None, max_length=40)
    tool_call_id: str | None = Field(None, max_length=40)
    approval_id: str | None = Field(None, max_length=40)
    rating: int | None = Field(None, ge=1, le=5)
    label: str = Field("", max_length=50, pattern=r"^([a-z0-9_.:-]+)?$")
    text: str = Field("", max_length=4000)

    @model_validator(mode="after")
    def one_subject(self) -> FeedbackIn:
        named = [f for f in ("decision_id", "tool_call_id", "approval_id") if getattr(self, f)]
        if len(named) > 1:
            raise ValueError(f"name one subject, not {' and '.join(named)}")
        return self

    def subject(self) -> tuple[str, str]:
        for kind in (Feedback.Subject.DECISION, Feedback.Subject.TOOL_CALL):
            if getattr(self, f"{kind}_id"):
                return kind, getattr(self, f"{kind}_id")
        if self.approval_id:
            return Feedback.Subject.APPROVAL, self.approval_id
        return Feedback.Subject.RUN, ""


class FeedbackOut(Schema):
    feedback_id: str
    run_id: str
    subject_kind: str
    subject_id: str
    rating: int | None
    label: str
    text: str
    given_by: str
    created_at: datetime


def feedback_out(fact: Feedback) -> dict[str, Any]:
    return {
        "feedback_id": fact.pk,
        "run_id": fact.run_id,
        "subject_kind": fact.subject_kind,
        "subject_id": fact.subject_id,
        "rating": fact.rating,
        "label": fact.label,
        "text": fact.text,
        "given_by": fact.actor,
        "created_at": fact.created_at,
    }


@router.post("/runs/{run_id}/feedback", response={201: FeedbackOut, **ERRORS})
def post_feedback(request: HttpRequest, run_id: str, payload: FeedbackIn) -> Status:
    """Record a feedback fact about the run or one of its decisions, tool calls or approvals:
    a rating (1 to 5) or a label, and words. It changes no runtime state."""
    subject_kind, subject_id = payload.subject()
    fact = feedback.feedback_record(
        tenant=request.auth.tenant,
        run_id=run_id,
        subject_kind=subject_kind,
        subject_id=subject_id,
        rating=payload.rating,
        label=payload.label,
        text=payload.text,
        actor=actor_for_key(request.auth),
        producer="api",
        api_key=request.auth,
    )
    return Status(201, feedback_out(fact))


# --- eval traces ----------------------------------------------------------------------------


class EvalQuery(Schema):
    # Records of runs with an event recorded at or after this moment (ISO 8601).
    since: datetime | None = None


@router.get("/eval-traces", response={200: None, 403: ErrorOut, **ERRORS})
def get_eval_traces(request: HttpRequest, query: Query[EvalQuery]) -> StreamingHttpResponse:
    """One `countersign.eval_trace/1` record per finished run, streamed as JSON Lines
    (`application/x-ndjson`), oldest `last_event_at` first. Go on with `?since=` the last
    record's `last_event_at`. Needs the `eval:read` scope (403 `eval.forbidden`)."""
    if not eval_trace.key_may_read(request.auth):
        raise DomainError(
            errors.EVAL_FORBIDDEN,
            "Eval traces are read with the eval:read scope, which this key does not have: a "
            "tenant admin issues one (create_api_key --scope eval:read) or exports them from "
            "the console (/eval-traces/export/).",
            status=403,
        )
    records = eval_trace.eval_traces(tenant=request.auth.tenant, since=query.since)
    return StreamingHttpResponse(eval_trace.jsonl(records), content_type="application/x-ndjson")
