"""Tool calls: one proposed side effect each, with two state machines (DESIGN section 4).

`execution_status` is what happened to our command; `verification_status` is what we observed
of domain reality afterwards. They are separate because a run can end while the outcome is
still being verified. Both change only through transitions, which services log as events.
"""

from __future__ import annotations

from functools import partial

from django.db import models
from django.utils import timezone
from django_fsm import FSMModelMixin, transition

from runs.changes import SavesChangedFields
from runs.ids import new_id
from runs.models import Decision, Run, Tenant
from runs.statefield import StateField

# Kept in their own module (this one stays within its size); read from here by the rest.
from toolcalls.statuses import (  # noqa: F401
    DESK_STATUSES,
    TERMINAL_STATUSES,
    AgentStatus,
    E,
    Execution,
    S,
    V,
    Verification,
)

# Registered with this app; kept in their own module (the sending is in toolcalls/webhooks.py).
from toolcalls.webhook_models import Webhook, WebhookAttempt, WebhookDelivery  # noqa: F401


class ToolCall(FSMModelMixin, SavesChangedFields, models.Model):
    id = models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, "tc"), editable=False
    )
    # No index of their own: Meta's begin with them, and a status change writes every index.
    tenant = models.ForeignKey(Tenant, models.PROTECT, related_name="tool_calls", db_index=False)
    run = models.ForeignKey(Run, models.PROTECT, related_name="tool_calls", db_index=False)
    capability_id = models.CharField(max_length=100)
    # NULL in nearly every row: indexed in Meta only where set (toolcall_decision).
    decision = models.ForeignKey(
        Decision, null=True, blank=True, on_delete=models.PROTECT, db_index=False
    )
    intent = models.CharField(max_length=200)
    object_ref = models.CharField(max_length=200)
    # The revision the agent computed the call from; None: no precondition on the object.
    object_revision = models.PositiveIntegerField(null=True, blank=True)
    args = models.JSONField()
    args_digest = models.CharField(max_length=64)
    # Names one business intent; fixed at proposal and sent with every attempt.
    idempotency_key = models.CharField(max_length=400)
    # Our id for the operation at the external system, for look-ups; fixed at proposal too.
    external_request_id = models.CharField(max_length=40, unique=True)
    execution_status = StateField(default=E.PROPOSED, choices=E.choices, protected=True)
    # When execution_status last changed (with its event): the desk's order, without the log.
    status_since = models.DateTimeField(default=timezone.now)
    verification_status = StateField(default=V.NOT_OBSERVED, choices=V.choices, protected=True)
    # Incremented by every claim; an outcome is recorded only with the current token.
    fencing_token = models.PositiveIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    lookups = models.PositiveIntegerField(default=0)
    verifications = models.PositiveIntegerField(default=0)
    external_id = models.CharField(max_length=100, blank=True)
    result = models.JSONField(null=True, blank=True)
    last_error_name = models.CharField(max_length=100, blank=True)
    last_error_message = models.TextField(blank=True)
    # The task graph inside a run: dispatched only once each of these is confirmed_success.
    depends_on = models.ManyToManyField(
        "self", symmetrical=False, blank=True, related_name="dependents"
    )
    # At most one compensation per call: toolcall_one_compensation in Meta, a unique index on
    # the rows that have one only (a OneToOneField's index would hold every call's NULL).
    compensation_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="compensations",
        db_index=False,
    )
    # The admin who took this item on the unknowns desk, so others see who has it.
    desk_owner = models.ForeignKey(
        "runs.User",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    desk_claimed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"], name="toolcall_unique_key_per_tenant"
            ),
            models.UniqueConstraint(
                fields=["compensation_of"],
                condition=models.Q(compensation_of__isnull=False),
                name="toolcall_one_compensation",
            ),
        ]
        indexes = [
            models.Index(fields=["execution_status", "lease_expires_at"]),
            models.Index(fields=["run", "execution_status"]),
            # Calls on an object: one writer, refunds left, the approval page's newest 20 first.
            models.Index(fields=["tenant", "object_ref", "created_at", "id"], name="toolcall_obj"),
            # The dashboard and /metrics count calls by status and attempts (fencing token) in
            # one scan of this index, not of the table.
            models.Index(
                fields=["tenant", "execution_status", "verification_status", "fencing_token"],
                name="toolcall_figures",
            ),
            # The desk: longest waits first (then id), counts by capability, from this index.
            models.Index(
                fields=["tenant", "status_since", "id"],
                include=["execution_status", "lease_expires_at", "capability_id"],
                condition=models.Q(execution_status__in=DESK_STATUSES),
                name="toolcall_desk",
            ),
            # Three columns NULL in nearly every row: indexed where set only, as each status
            # change (never HOT) writes an entry in every index. `x = %s`, the foreign key's
            # check included, implies `x IS NOT NULL`, so these serve every look-up by value.
            models.Index(
                fields=["decision"],
                condition=models.Q(decision__isnull=False),
                name="toolcall_decision",
            ),
            models.Index(
                fields=["desk_owner"],
                condition=models.Q(desk_owner__isnull=False),
                name="toolcall_desk_owner",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.capability_id} {self.execution_status}"

    # Status groupings, named once. Call sites read `call.is_unknown`, not tuples.
    FINAL_EXECUTION = (
        E.COMPLETED,
        E.FAILED,
        E.REJECTED,
        E.EXPIRED,
        E.INVALIDATED,
        E.CANCELLED,
        E.COMPENSATED,
    )
    # The outcome is not known: looked up by the reconciler, or owned by a person.
    UNKNOWN = (E.RESULT_UNKNOWN, E.NEEDS_HUMAN)
    # Nothing has left yet: stopping the run cancels these.
    NOT_SENT = (E.PROPOSED, E.AWAITING_APPROVAL, E.AUTHORIZED)
    # Sent, and its outcome still arrives by itself: stopping the run reports these.
    IN_FLIGHT = (E.DISPATCHING, E.RESULT_UNKNOWN, E.ACCEPTED)
    # Still on its way to an outcome without a person: a run cannot finish before these.
    ON_ITS_WAY = (*NOT_SENT, E.DISPATCHING, E.ACCEPTED, E.COMPENSATING)
    # Ended without the effect it asked for.
    DID_NOT_SUCCEED = (E.FAILED, E.REJECTED, E.EXPIRED, E.INVALIDATED, E.CANCELLED)
    # A call that depends on one of these is cancelled: it will never be confirmed.
    CANNOT_SUCCEED = (*DID_NOT_SUCCEED, E.COMPENSATING, E.COMPENSATED, E.NEEDS_HUMAN)
    FAILED_VERIFICATION = (V.CONFIRMED_FAILURE, V.INCONCLUSIVE)
    # Its effect may be on its way to the external system's books: counted against what the
    # object still allows (what is still refundable) — with completed calls whose effect
    # verification has not yet confirmed there (toolcalls/selectors.py).
    EFFECT_PENDING = (*NOT_SENT, E.DISPATCHING, E.ACCEPTED, *UNKNOWN)
    UNCONFIRMED = (V.NOT_OBSERVED, V.PENDING, V.INCONCLUSIVE)

    @property
    def is_settled(self) -> bool:
        """Nothing more will happen to it without a person asking."""
        return (
            self.execution_status in self.FINAL_EXECUTION and self.verification_status != V.PENDING
        )

    # Sent and acknowledged: what it achieved is what verification observed.
    SENT = (E.ACCEPTED, E.COMPLETED, E.COMPENSATING, E.COMPENSATED)
    STATUS_BY_EXECUTION = {
        E.PROPOSED: S.RUNNING,
        E.AUTHORIZED: S.RUNNING,
        E.DISPATCHING: S.RUNNING,
        E.AWAITING_APPROVAL: S.AWAITING_APPROVAL,
        E.FAILED: S.FAILED,
        E.RESULT_UNKNOWN: S.UNKNOWN,
        E.NEEDS_HUMAN: S.UNKNOWN,
        E.REJECTED: S.REJECTED,
        E.EXPIRED: S.EXPIRED,
        E.INVALIDATED: S.CANCELLED,
        E.CANCELLED: S.CANCELLED,
    }
    STATUS_BY_VERIFICATION = {
        V.NOT_OBSERVED: S.RUNNING,
        V.PENDING: S.RUNNING,
        V.CONFIRMED_SUCCESS: S.SUCCEEDED,
        V.CONFIRMED_FAILURE: S.FAILED,
        V.INCONCLUSIVE: S.UNKNOWN,
    }

    @property
    def agent_status(self) -> str:
        """The one word an agent acts on (AgentStatus). A call that was sent is judged by what
        verification observed, not by the system's answer alone."""
        if self.execution_status in self.SENT:
            return self.STATUS_BY_VERIFICATION[self.verification_status]
        return self.STATUS_BY_EXECUTION[self.execution_status]

    @property
    def is_terminal(self) -> bool:
        return self.agent_status in TERMINAL_STATUSES

    @property
    def is_unknown(self) -> bool:
        return self.execution_status in self.UNKNOWN

    @property
    def is_verified(self) -> bool:
        return self.verification_status == V.CONFIRMED_SUCCESS

    @property
    def has_compensation(self) -> bool:
        return ToolCall.objects.filter(compensation_of_id=self.pk).exists()

    @property
    def is_on_its_way(self) -> bool:
        return self.execution_status in self.ON_ITS_WAY or self.verification_status == V.PENDING

    @property
    def did_not_succeed(self) -> bool:
        return (
            self.execution_status in self.DID_NOT_SUCCEED
            or self.verification_status in self.FAILED_VERIFICATION
        )

    @property
    def cannot_succeed(self) -> bool:
        return (
            self.execution_status in self.CANNOT_SUCCEED
            or self.verification_status in self.FAILED_VERIFICATION
        )

    # --- execution ------------------------------------------------------------------------

    @transition(
        field=execution_status, source=[E.PROPOSED, E.AUTHORIZED], target=E.AWAITING_APPROVAL
    )
    def request_approval(self) -> None:
        """From authorized when a re-dispatch finds its arguments, object or policy changed."""

    @transition(
        field=execution_status,
        # Back to authorized, same key: a retryable error before anything executed, a look-up
        # that proved the operation absent, or a person who established it did not happen.
        source=[
            E.PROPOSED,
            E.AWAITING_APPROVAL,
            E.DISPATCHING,
            E.RESULT_UNKNOWN,
            E.NEEDS_HUMAN,
            E.FAILED,
        ],
        target=E.AUTHORIZED,
    )
    def authorize(self) -> None:
        pass

    @transition(field=execution_status, source=E.AUTHORIZED, target=E.DISPATCHING)
    def claim(self) -> None:
        """Our command may leave from here on: a lost answer is result_unknown."""

    @transition(
        field=execution_status,
        source=[E.DISPATCHING, E.RESULT_UNKNOWN, E.NEEDS_HUMAN],
        target=E.ACCEPTED,
    )
    def accept(self) -> None:
        """The external system acknowledged this exact operation (we hold its receipt)."""

    @transition(field=execution_status, source=E.ACCEPTED, target=E.COMPLETED)
    def complete(self) -> None:
        pass

    @transition(
        field=execution_status,
        # From result_unknown and needs_human only when a person established that it did
        # not happen (or abandoned it): never on a guess.
        source=[E.AUTHORIZED, E.DISPATCHING, E.ACCEPTED, E.RESULT_UNKNOWN, E.NEEDS_HUMAN],
        target=E.FAILED,
    )
    def fail(self) -> None:
        pass

    @transition(field=execution_status, source=E.DISPATCHING, target=E.RESULT_UNKNOWN)
    def mark_unknown(self) -> None:
        pass

    @transition(
        field=execution_status, source=[E.RESULT_UNKNOWN, E.DISPATCHING], target=E.NEEDS_HUMAN
    )
    def hand_to_human(self) -> None:
        pass

    @transition(
        field=execution_status,
        source=[E.PROPOSED, E.AWAITING_APPROVAL, E.AUTHORIZED],
        target=E.CANCELLED,
    )
    def cancel(self) -> None:
        pass

    @transition(field=execution_status, source=E.AWAITING_APPROVAL, target=E.REJECTED)
    def reject(self) -> None:
        pass

    @transition(field=execution_status, source=E.AWAITING_APPROVAL, target=E.EXPIRED)
    def expire(self) -> None:
        pass

    @transition(
        field=execution_status, source=[E.AWAITING_APPROVAL, E.AUTHORIZED], target=E.INVALIDATED
    )
    def invalidate(self) -> None:
        pass

    @transition(field=execution_status, source=E.COMPLETED, target=E.COMPENSATING)
    def start_compensation(self) -> None:
        pass

    @transition(field=execution_status, source=E.COMPENSATING, target=E.COMPENSATED)
    def finish_compensation(self) -> None:
        pass

    # --- verification ---------------------------------------------------------------------

    @transition(field=verification_status, source=V.NOT_OBSERVED, target=V.PENDING)
    def await_verification(self) -> None:
        pass

    @transition(
        field=verification_status,
        source=[V.NOT_OBSERVED, V.PENDING, V.INCONCLUSIVE],
        target=V.CONFIRMED_SUCCESS,
    )
    def confirm_success(self) -> None:
        pass

    @transition(
        field=verification_status,
        source=[V.NOT_OBSERVED, V.PENDING, V.INCONCLUSIVE],
        target=V.CONFIRMED_FAILURE,
    )
    def confirm_failure(self) -> None:
        pass

    @transition(field=verification_status, source=V.PENDING, target=V.INCONCLUSIVE)
    def find_inconclusive(self) -> None:
        pass


class Attempt(models.Model):
    """One claim of a call by a worker: what it sent, under which fencing token, and how it
    ended."""

    class Classification(models.TextChoices):
        IN_FLIGHT = "in_flight"
        CONFIRMED = "confirmed"
        REJECTED = "rejected"
        RETRYABLE = "retryable"
        UNKNOWN = "unknown"
        STALE = "stale"
        NOT_SENT = "not_sent"

    id = models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, "att"), editable=False
    )
    tool_call = models.ForeignKey(ToolCall, models.PROTECT, related_name="attempts", db_index=False)
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="attempts")
    number = models.PositiveIntegerField()
    fencing_token = models.PositiveIntegerField()
    worker = models.CharField(max_length=200)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    classification = models.CharField(
        max_length=20, choices=Classification.choices, default=Classification.IN_FLIGHT
    )
    error_name = models.CharField(max_length=100, blank=True)
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["tool_call_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["tool_call", "number"], name="attempt_unique_number")
        ]

    def __str__(self) -> str:
        return f"{self.tool_call_id} attempt {self.number} ({self.classification})"


class Receipt(models.Model):
    """What the external system said it did, verbatim."""

    class Status(models.TextChoices):
        CREATED = "created"
        ALREADY_EXISTS = "already_exists"

    class Source(models.TextChoices):
        DISPATCH = "dispatch"
        LOOKUP = "lookup"
        PERSON = "person"

    id = models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, "rcp"), editable=False
    )
    tool_call = models.ForeignKey(ToolCall, on_delete=models.PROTECT, related_name="receipts")
    attempt = models.ForeignKey(Attempt, null=True, blank=True, on_delete=models.PROTECT)
    external_id = models.CharField(max_length=100)
    status = models.CharField(max_length=20, choices=Status.choices)
    source = models.CharField(max_length=20, choices=Source.choices)
    raw_response = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            # Deduplicated resends, counted by /metrics: few rows, so a small partial index.
            models.Index(
                fields=["tool_call"],
                condition=models.Q(status="already_exists"),
                name="receipt_replayed",
            )
        ]

    def __str__(self) -> str:
        return f"{self.external_id} ({self.status}, {self.source})"


class ObjectRevision(models.Model):
    """The revision of a business object as Countersign last knew it. A write that completes
    moves it on, so a call computed from an older revision fails with precondition.conflict."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT)
    ref = models.CharField(max_length=200)
    revision = models.PositiveIntegerField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "ref"], name="objectrevision_unique_ref")
        ]

    def __str__(self) -> str:
        return f"{self.ref}@{self.revision}"


class CircuitBreaker(models.Model):
    """Per tenant and capability: open stops dispatch; after the cool-down one probe passes."""

    class State(models.TextChoices):
        CLOSED = "closed"
        OPEN = "open"
        HALF_OPEN = "half_open"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT)
    capability_id = models.CharField(max_length=100)
    state = models.CharField(max_length=20, choices=State.choices, default=State.CLOSED)
    opened_until = models.DateTimeField(null=True, blank=True)
    # The tool call holding the half-open probe; nobody else passes while it is set.
    probe_tool_call_id = models.CharField(max_length=40, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "capability_id"], name="circuitbreaker_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.capability_id} {self.state}"
