"""Writing and reading checkpoints.

Each write is a new immutable version of the run's checkpoint `name`, with its own id
(`ckpt_…`), and its `checkpoint.saved` event in the same transaction. Writing the same body
again answers the latest version instead of adding one, so a retried PUT is harmless. Reads
return a version migrated to the schema the reader wants (memory/schemas.py).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import OuterRef, QuerySet, Subquery
from django.utils import timezone

from memory import errors, schemas
from memory.archive import refuse_if_archived
from memory.models import Checkpoint
from runs import events, run_end
from runs.canonical import canonical_json, digest
from runs.errors import RUN_CLOSED, DomainError, not_found
from runs.models import Decision, Run, Tenant
from toolcalls.lifecycle import run_lock
from toolcalls.models import ToolCall


def checkpoint_save(
    *,
    tenant: Tenant,
    run_id: str,
    name: str,
    kind: str,
    schema_version: int,
    body: dict[str, Any],
    actor: str,
) -> tuple[Checkpoint, bool]:
    """(the checkpoint, whether a new version was written)."""
    schemas.refuse_chain_of_thought(body)
    size = len(canonical_json(body))
    if size > settings.CHECKPOINT_MAX_BYTES:
        raise DomainError(
            errors.CHECKPOINT_TOO_LARGE,
            f"The checkpoint is {size} bytes as canonical JSON; at most "
            f"{settings.CHECKPOINT_MAX_BYTES} are kept (CHECKPOINT_MAX_BYTES). Keep ids and "
            "where you are, not copies: receipts are referenced by tool_call_ids.",
            status=413,
        )
    body_digest = digest(body)
    with transaction.atomic():
        run = run_lock(run_id, tenant=tenant)
        if not run.is_open:
            raise DomainError(
                RUN_CLOSED, f"Run {run.pk} is {run.state}; its checkpoints are final."
            )
        _check_references(run, body)
        latest = Checkpoint.objects.filter(run=run, name=name).order_by("-version").first()
        if latest and (latest.body_digest, latest.schema_version, latest.kind) == (
            body_digest,
            schema_version,
            kind,
        ):
            return latest, False
        checkpoint = Checkpoint.objects.create(
            tenant=tenant,
            run=run,
            name=name,
            kind=kind,
            version=latest.version + 1 if latest else 1,
            schema_version=schema_version,
            body=body,
            body_digest=body_digest,
            size_bytes=size,
            actor=actor,
        )
        events.append(
            run=run,
            event_type="checkpoint.saved",
            payload=_saved_payload(checkpoint),
            producer="api",
            actor=actor,
        )
    return checkpoint, True


def _saved_payload(checkpoint: Checkpoint) -> dict[str, Any]:
    body = checkpoint.body
    return {
        "checkpoint_id": checkpoint.pk,
        "name": checkpoint.name,
        "kind": checkpoint.kind,
        "version": checkpoint.version,
        "schema_version": checkpoint.schema_version,
        "body_digest": checkpoint.body_digest,
        "size_bytes": checkpoint.size_bytes,
        "state": body["state"],
        "step_index": body["step_index"],
        "decision_ids": body.get("decision_ids", []),
        "tool_call_ids": body.get("tool_call_ids", []),
    }


def _check_references(run: Run, body: dict[str, Any]) -> None:
    """Decisions and tool calls are referenced by id, and must be this run's."""
    problems = []
    for field, model in (("decision_ids", Decision), ("tool_call_ids", ToolCall)):
        ids = set(body.get(field, []))
        found = set(model.objects.filter(run=run, pk__in=ids).values_list("pk", flat=True))
        if missing := sorted(ids - found):
            problems.append({"field": field, "problem": f"not of this run: {', '.join(missing)}"})
    if problems:
        raise DomainError(
            errors.CHECKPOINT_FOREIGN_REFERENCE,
            "A checkpoint references this run's own decisions and tool calls only: "
            + "; ".join(f"{p['field']} {p['problem']}" for p in problems)
            + ".",
            status=422,
            details=problems,
        )


# --- reads ----------------------------------------------------------------------------------


def checkpoint_versions(*, run: Run, name: str) -> QuerySet[Checkpoint]:
    refuse_if_archived(run)
    return Checkpoint.objects.filter(run=run, name=name).order_by("version")


def checkpoint_get(*, run: Run, name: str, version: int | None = None) -> Checkpoint:
    versions = checkpoint_versions(run=run, name=name)
    checkpoint = (
        versions.filter(version=version).first()
        if version
        else versions.order_by("-version").first()
    )
    if checkpoint is None:
        what = f"{name} v{version}" if version else name
        raise not_found("checkpoint", what)
    return checkpoint


def checkpoints_latest(*, run: Run) -> QuerySet[Checkpoint]:
    """The latest version of each of the run's checkpoints, by name."""
    newest = (
        Checkpoint.objects.filter(run=run, name=OuterRef("name"))
        .order_by("-version")
        .values("pk")[:1]
    )
    return Checkpoint.objects.filter(run=run, pk=Subquery(newest)).order_by("name")


def checkpoint_out(checkpoint: Checkpoint, *, schema_version: int | None = None) -> dict:
    """The checkpoint as a reader sees it: its body migrated to `schema_version` (the
    latest registered for its kind by default), its unknown fields kept, its ids beside."""
    version, body = schemas.migrate(
        checkpoint.kind, checkpoint.schema_version, checkpoint.body, schema_version
    )
    return {
        **body,
        "checkpoint_id": checkpoint.pk,
        "run_id": checkpoint.run_id,
        "name": checkpoint.name,
        "kind": checkpoint.kind,
        "version": checkpoint.version,
        "schema_version": version,
        "written_schema_version": checkpoint.schema_version,
        "created_at": checkpoint.created_at,
        "archived_at": checkpoint.archived_at,
    }


def checkpoint_summary(checkpoint: Checkpoint) -> dict[str, Any]:
    return {
        "checkpoint_id": checkpoint.pk,
        "name": checkpoint.name,
        "kind": checkpoint.kind,
        "version": checkpoint.version,
        "schema_version": checkpoint.schema_version,
        "size_bytes": checkpoint.size_bytes,
        "body_digest": checkpoint.body_digest,
        "created_at": checkpoint.created_at,
        "archived_at": checkpoint.archived_at,
    }


# --- the run's end --------------------------------------------------------------------------


@run_end.register
def checkpoints_archive(*, run: Run, actor: str, producer: str, reason: str) -> None:
    """The run ended: its checkpoints are archived — marked with `archived_at`, the one
    column PostgreSQL lets change on a stored version (memory migration 0003) — and stay
    readable, by `GET …/checkpoints/{name}`, the resume contract and the eval trace."""
    ids = list(
        Checkpoint.objects.filter(run=run, archived_at__isnull=True)
        .order_by("name", "version")
        .values_list("pk", flat=True)
    )
    if not ids:
        return
    Checkpoint.objects.filter(pk__in=ids).update(archived_at=timezone.now())
    events.append(
        run=run,
        event_type="checkpoints.archived",
        payload={"checkpoint_ids": ids, "reason": reason},
        producer=producer,
        actor=actor,
    )
