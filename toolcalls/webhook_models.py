"""Webhooks of a tenant, their deliveries and each delivery attempt (the console's delivery
log). Models of the toolcalls app, kept in their own module; toolcalls/models.py imports them
so that Django registers them. The sending is in toolcalls/webhooks.py."""

from __future__ import annotations

import secrets
from functools import partial
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.db import models

from runs.ids import new_id
from runs.models import Tenant


def new_secret() -> str:
    return f"whsec_{secrets.token_urlsafe(32)}"


class Webhook(models.Model):
    """Where a tenant wants to hear about decided approvals and calls that reached a terminal
    status: a URL, the event types, and the secret each delivery is signed with.

    A `slack` channel is a Slack-compatible incoming webhook: it gets a chat message (the
    plain-words summary and a link, toolcalls/channels.py) about new approvals, escalations
    and desk items instead of the signed JSON envelope."""

    class Kind(models.TextChoices):
        SIGNED = "signed", "Signed JSON webhook"
        SLACK = "slack", "Slack-compatible incoming webhook"

    class EventType(models.TextChoices):
        APPROVAL_DECIDED = "approval.decided"
        TOOL_CALL_TERMINAL = "tool_call.terminal"
        # What people are asked to look at: what a chat channel is for.
        APPROVAL_REQUESTED = "approval.requested"
        APPROVAL_ESCALATED = "approval.escalated"
        DESK_ITEM_ADDED = "desk.item_added"
        # A call's outcome unknown past its consistency window, look-ups failing: money may
        # have moved and nobody knows yet (toolcalls/channels.py, once per call).
        TOOL_CALL_STILL_UNKNOWN = "tool_call.still_unknown"

    # The events a chat message exists for (toolcalls/channels.py writes one for each).
    CHAT_EVENT_TYPES = (
        EventType.APPROVAL_REQUESTED,
        EventType.APPROVAL_ESCALATED,
        EventType.DESK_ITEM_ADDED,
        EventType.TOOL_CALL_STILL_UNKNOWN,
    )

    id = models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, "whk"), editable=False
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="webhooks")
    url = models.URLField(max_length=500)
    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.SIGNED)
    # Kept as written: the receiver checks the HMAC with the same secret.
    secret = models.CharField(max_length=100, default=new_secret)
    event_types = models.JSONField(default=list)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.id} {self.url}"

    @property
    def shown_url(self) -> str:
        """The URL as pages show it. A chat channel's incoming-webhook URL is its own
        credential (whoever has it can post to the channel): only its host and last
        characters. A signed webhook's URL is not; its secret is elsewhere."""
        if self.kind != self.Kind.SLACK or len(self.url) <= 24:
            return self.url
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}/…{self.url[-4:]}"

    def clean(self) -> None:
        unknown = set(self.event_types or []) - set(self.EventType.values)
        if not isinstance(self.event_types, list) or unknown or not self.event_types:
            raise ValidationError(
                {"event_types": f"A non-empty list of: {', '.join(self.EventType.values)}."}
            )
        if self.kind == self.Kind.SLACK and set(self.event_types) - set(self.CHAT_EVENT_TYPES):
            raise ValidationError(
                {"event_types": f"A chat channel hears of: {', '.join(self.CHAT_EVENT_TYPES)}."}
            )


class WebhookDelivery(models.Model):
    """One event for one webhook. Its body is fixed when the event happens; every attempt
    signs that body with a fresh timestamp."""

    class State(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"  # every attempt used
        CANCELLED = "cancelled"  # the webhook was deactivated before it was delivered

    id = models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, "whd"), editable=False
    )
    webhook = models.ForeignKey(Webhook, on_delete=models.PROTECT, related_name="deliveries")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    event_type = models.CharField(max_length=50)
    # The event's id in the body, the same for every webhook and attempt: receivers dedupe by it.
    event_id = models.CharField(max_length=100)
    tool_call_id = models.CharField(max_length=40, blank=True)
    run_id = models.CharField(max_length=40, blank=True)
    body = models.TextField()
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # Set while a worker sends it: a second worker with the same message does not.
    claimed_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "-created_at"], name="webhookdelivery_tenant")]

    def __str__(self) -> str:
        return f"{self.id} {self.event_type} {self.state}"


class WebhookAttempt(models.Model):
    """One POST of a delivery: what the receiver answered (or why there was no answer), and
    how long it took."""

    delivery = models.ForeignKey(
        WebhookDelivery, on_delete=models.PROTECT, related_name="attempt_log"
    )
    number = models.PositiveSmallIntegerField()
    started_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["delivery_id", "number"]
        constraints = [
            models.UniqueConstraint(
                fields=["delivery", "number"], name="webhookattempt_unique_number"
            )
        ]

    def __str__(self) -> str:
        return f"{self.delivery_id} attempt {self.number} ({self.status_code or self.error})"
