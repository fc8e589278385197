"""Approval policies (data, versioned) and approvals bound to one tool call's arguments.

The approvals app sits below toolcalls: it never imports it. An approval names the tool call
it is bound to by foreign key ("toolcalls.ToolCall", a string), and toolcalls acts on what
approvals decide (toolcalls/gate.py).
"""

from __future__ import annotations

from datetime import datetime
from functools import partial

from django.db import models
from django_fsm import FSMModelMixin, transition

from runs.changes import SavesChangedFields
from runs.ids import new_id
from runs.models import Run, Tenant, User
from runs.statefield import StateField


class Policy(models.Model):
    """Who must approve a capability's calls. Rows are never edited: saving a change in the
    admin writes the next version, so every approval names exactly the rules it was asked under.

    `rules` is a list of {"name", "when", "approvers", "risk"}; `when` is a condition on the
    arguments (approvals/conditions.py). The matching rule that asks for the most approvers
    wins; no match (or 0 approvers) lets the call through.
    """

    class OnExpiry(models.TextChoices):
        CANCEL = "cancel", "Cancel the call"
        HAND_TO_HUMAN = "hand_to_human", "Hand the run to a person"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="policies")
    capability_id = models.CharField(max_length=100)
    version = models.PositiveIntegerField()
    rules = models.JSONField(default=list, blank=True)
    expiry_seconds = models.PositiveIntegerField(default=24 * 3600)
    on_expiry = models.CharField(max_length=20, choices=OnExpiry.choices, default=OnExpiry.CANCEL)
    # Who hears about approvals close to expiry: comma-separated targets, each an email address
    # or the name of a Django auth group, whose active members of the tenant are mailed
    # (approvals/notifications.py).
    escalation_group = models.CharField(max_length=500, blank=True)
    escalate_before_seconds = models.PositiveIntegerField(default=3600)
    created_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant", "capability_id", "-version"]
        verbose_name_plural = "policies"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "capability_id", "version"], name="policy_unique_version"
            )
        ]

    def __str__(self) -> str:
        return f"{self.capability_id} v{self.version} ({self.tenant.slug})"


class Approval(FSMModelMixin, SavesChangedFields, models.Model):
    class State(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        CONSUMED = "consumed"
        REJECTED = "rejected"
        EXPIRED = "expired"
        INVALIDATED = "invalidated"
        CANCELLED = "cancelled"

    OPEN_STATES = (State.PENDING, State.APPROVED)

    id = models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, "apr"), editable=False
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="approvals")
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="approvals")
    tool_call = models.ForeignKey(
        "toolcalls.ToolCall", on_delete=models.PROTECT, related_name="approvals"
    )
    state = StateField(default=State.PENDING, choices=State.choices, protected=True)
    # What exactly is approved: these arguments, on this revision of the object, in this scope.
    args = models.JSONField()
    args_digest = models.CharField(max_length=64)
    object_ref = models.CharField(max_length=200)
    object_revision = models.PositiveIntegerField(null=True, blank=True)
    permission = models.CharField(max_length=100)
    policy = models.ForeignKey(Policy, on_delete=models.PROTECT)
    policy_version = models.PositiveIntegerField()
    rule_name = models.CharField(max_length=200)
    risk = models.CharField(max_length=20)
    required_approvers = models.PositiveSmallIntegerField()
    summary = models.TextField()
    summary_hash = models.CharField(max_length=64)
    # The person on whose behalf the agent asked: never an approver of it.
    requested_by = models.ForeignKey(
        User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    expires_at = models.DateTimeField()
    # When beat decided to escalate it (its email is a Notification, sent through the outbox).
    escalated_at = models.DateTimeField(null=True, blank=True)
    # When the approvers' email was recorded as sent.
    notified_at = models.DateTimeField(null=True, blank=True)
    # Bumped by every change: a form rendered at another version is stale.
    version = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["expires_at"]
        indexes = [
            models.Index(fields=["tenant", "state", "expires_at"]),
            # The inbox's poll asks whether anything pending changed since it last looked.
            # With created_at in it, the dashboard counts pending approvals by age from this
            # index alone (created_at never changes: no update pays for it).
            models.Index(
                fields=["tenant", "state", "updated_at"],
                include=["created_at"],
                name="approval_changed",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.state}"

    @property
    def is_open(self) -> bool:
        return self.state in self.OPEN_STATES

    @property
    def is_pending(self) -> bool:
        return self.state == self.State.PENDING

    @property
    def approvals_so_far(self) -> int:
        """How many distinct people approved (a rejection ends the approval instead). The inbox
        annotates it as `approved_count` in its one query."""
        counted = self.__dict__.get("approved_count")
        if counted is not None:
            return counted
        return self.decisions.exclude(decision=ApprovalDecision.Kind.REJECT).count()

    def can_be_decided_by(self, user: User, now: datetime) -> bool:
        """The rule the approval page shows buttons by; the decision services enforce the same
        rules and say which one failed (approvals/services.py)."""
        return (
            self.is_pending
            and self.expires_at > now
            and user.can_decide
            and user.tenant_id == self.tenant_id
            and self.requested_by_id != user.pk
        )

    # Every change bumps `version`: a form rendered at another version is stale.

    @transition(field=state, source=State.PENDING, target=State.APPROVED)
    def approve(self) -> None:
        self.version += 1

    @transition(field=state, source=State.PENDING, target=State.REJECTED)
    def reject(self) -> None:
        self.version += 1

    @transition(field=state, source=State.APPROVED, target=State.CONSUMED)
    def consume(self) -> None:
        """Used once, by the dispatch it authorizes."""
        self.version += 1

    @transition(field=state, source=OPEN_STATES, target=State.EXPIRED)
    def expire(self) -> None:
        self.version += 1

    @transition(field=state, source=OPEN_STATES, target=State.INVALIDATED)
    def invalidate(self) -> None:
        self.version += 1

    @transition(field=state, source=OPEN_STATES, target=State.CANCELLED)
    def cancel(self) -> None:
        self.version += 1


class ApprovalDecision(models.Model):
    """One person's decision, with what they were shown."""

    class Kind(models.TextChoices):
        APPROVE = "approve"
        REJECT = "reject"
        APPROVE_WITH_EDITS = "approve_with_edits"

    approval = models.ForeignKey(Approval, on_delete=models.PROTECT, related_name="decisions")
    user = models.ForeignKey(User, on_delete=models.PROTECT, related_name="+")
    decision = models.CharField(max_length=20, choices=Kind.choices)
    reason = models.TextField(blank=True)
    summary_hash = models.CharField(max_length=64)
    # {"field": {"from": old, "to": new}} for approve_with_edits.
    edit_diff = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            # The same person twice counts once.
            models.UniqueConstraint(fields=["approval", "user"], name="decision_one_per_person")
        ]

    def __str__(self) -> str:
        # How the approval page names who decided.
        return self.user.username


class Notification(models.Model):
    """One email about an approval, sent at least once and recorded once, by its send key.

    Its outbox message is done only after the send: a send that fails is tried again. A task
    claims the send for a lease (a second delivery of the message leaves it to the first),
    sends, then records `sent_at`; a crash between the send and the record sends it one more
    time, never zero times (approvals/notifications.py)."""

    class Kind(models.TextChoices):
        APPROVERS = "approvers", "Approval needed"
        ESCALATION = "escalation", "Escalation"

    send_key = models.CharField(max_length=200, unique=True)
    approval = models.ForeignKey(Approval, on_delete=models.PROTECT, related_name="notifications")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    recipients = models.JSONField(default=list)
    subject = models.CharField(max_length=200)
    # A task is sending it until then; after, another may (the first died mid-send).
    claimed_until = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.send_key} ({'sent' if self.sent_at else 'not sent'})"


class ApprovalLatency(models.Model):
    """Approval latency as counts (approvals/latency.py): per tenant and bucket, how many
    approvals were decided within it and their summed microseconds. Written in the
    transaction that decides, so the dashboard and /metrics read a few rows, not every
    decision in the log."""

    tenant = models.ForeignKey("runs.Tenant", on_delete=models.CASCADE, related_name="+")
    # Index into approvals.latency.BUCKETS of the first bound the latency is within;
    # len(BUCKETS) for longer ones.
    bucket = models.PositiveSmallIntegerField()
    count = models.PositiveIntegerField(default=0)
    # Microseconds, an integer: the sum is exact whatever the order it was added in.
    total_us = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "bucket"], name="approval_latency_bucket")
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} bucket {self.bucket}: {self.count}"
