"""Feedback facts: a person's or an agent's judgment about a run, one of its decisions, tool
calls or approvals — a rating from 1 to 5, a label, words.

A fact of its own kind (seed 000, "practice advice"): it is recorded with its own id and its
`feedback.recorded` event, and changes no runtime state — no run, call or approval moves,
nothing is enqueued. It may come after the run ended.
"""

from __future__ import annotations

from django.db import connection, transaction

from approvals.models import Approval
from memory import errors, sql
from memory.models import Feedback
from runs import events
from runs.errors import DomainError
from runs.models import ApiKey, Decision, Run, Tenant, User
from runs.selectors import run_get
from toolcalls.models import ToolCall

SUBJECT_MODELS = {
    Feedback.Subject.DECISION: Decision,
    Feedback.Subject.TOOL_CALL: ToolCall,
    Feedback.Subject.APPROVAL: Approval,
}


def feedback_record(
    *,
    tenant: Tenant,
    run_id: str,
    subject_kind: str,
    subject_id: str,
    rating: int | None,
    label: str,
    text: str,
    actor: str,
    producer: str,
    user: User | None = None,
    api_key: ApiKey | None = None,
) -> Feedback:
    """Record one feedback fact about `subject_kind` `subject_id` of the run (the run itself
    when subject_kind is "run")."""
    run = run_get(tenant=tenant, run_id=run_id)
    if rating is None and not label:
        raise DomainError(
            errors.FEEDBACK_EMPTY,
            "Give a rating (1 to 5) or a label (such as wrong_amount), and words if you like.",
            status=422,
        )
    subject_id = _subject_of_run(run, subject_kind, subject_id)
    with transaction.atomic():
        feedback = Feedback.objects.create(
            tenant=tenant,
            run=run,
            subject_kind=subject_kind,
            subject_id=subject_id,
            rating=rating,
            label=label,
            text=text,
            actor=actor,
            user=user,
            api_key=api_key,
        )
        events.append(
            run=run,
            event_type="feedback.recorded",
            payload={
                "feedback_id": feedback.pk,
                "subject_kind": subject_kind,
                "subject_id": subject_id,
                "rating": rating,
                "label": label,
                "text": text,
            },
            producer=producer,
            actor=actor,
            # Searchable by the decision or approval it is about. Not by tool call: that column
            # chains a call's own events (each caused by the one before).
            ids=events.Ids(
                decision_id=subject_id if subject_kind == Feedback.Subject.DECISION else "",
                approval_id=subject_id if subject_kind == Feedback.Subject.APPROVAL else "",
            ),
        )
    return feedback


def _subject_of_run(run: Run, subject_kind: str, subject_id: str) -> str:
    if subject_kind == Feedback.Subject.RUN:
        if subject_id not in ("", run.pk):
            raise _not_in_run(run, "run", subject_id)
        return run.pk
    model = SUBJECT_MODELS[subject_kind]
    if not subject_id or not model.objects.filter(run=run, pk=subject_id).exists():
        raise _not_in_run(run, subject_kind, subject_id)
    return subject_id


def _not_in_run(run: Run, subject_kind: str, subject_id: str) -> DomainError:
    return DomainError(
        errors.FEEDBACK_SUBJECT_NOT_IN_RUN,
        f"{subject_id or '(no id)'} is not a {subject_kind.replace('_', ' ')} of run {run.pk}; "
        "feedback is about the run it is posted to.",
        status=422,
        details=[{"field": f"{subject_kind}_id", "problem": "not of this run"}],
    )


def run_feedback(*, run: Run) -> list[Feedback]:
    if connection.vendor == "postgresql":
        return sql.feedback(run.pk)  # the same read, written out
    return run_feedback_orm(run=run)


def run_feedback_orm(*, run: Run) -> list[Feedback]:
    return list(Feedback.objects.filter(run=run).order_by("id"))


def approval_feedback(*, approval: Approval) -> list[Feedback]:
    if connection.vendor == "postgresql":
        return sql.feedback(approval.run_id, (Feedback.Subject.APPROVAL, approval.pk))
    return approval_feedback_orm(approval=approval)


def approval_feedback_orm(*, approval: Approval) -> list[Feedback]:
    return list(
        Feedback.objects.filter(
            run_id=approval.run_id, subject_kind=Feedback.Subject.APPROVAL, subject_id=approval.pk
        ).order_by("id")
    )
