"""What a tenant's admins changed: a policy published, a person's role, an API key issued or
revoked. Models of the runs app, kept in their own module; runs/models.py imports them so that
Django registers them. Written by runs/admin_events.py."""

from __future__ import annotations

from functools import partial

from django.db import models
from django.utils import timezone

from runs.ids import new_id


class AdminEvent(models.Model):
    """One typed fact about a tenant's administration. The event log (`Event`) is per run and
    hash-chained per run; these belong to no run, so they have their own append-only table,
    with the same schema registry (runs/events.py) checking each payload, and their own hash
    chain per tenant (`seq`, `prev_hash`, `hash`; runs/admin_events.py).

    Not in a run's chain: a policy published or a key revoked is no step of any run. Chained
    into one, it would sit in whichever run happened to be current, vanish from the chain
    an archived run keeps, and make every admin change wait on a run's row lock."""

    id = models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, "adm"), editable=False
    )
    tenant = models.ForeignKey("runs.Tenant", on_delete=models.PROTECT, related_name="+")
    event_type = models.CharField(max_length=100)
    schema_version = models.PositiveSmallIntegerField()
    # "user:<username>" of the admin who did it.
    actor = models.CharField(max_length=200)
    # What changed, as "policy:<capability>", "user:<username>" or "api_key:<id>".
    subject = models.CharField(max_length=200)
    payload = models.JSONField()
    # Set before the row is hashed (runs/admin_events.py), so not auto_now_add, which would
    # overwrite it at save.
    occurred_at = models.DateTimeField(default=timezone.now)
    # The tenant's admin chain: 1, 2, 3… and the hash of the one before (GENESIS_HASH first).
    seq = models.PositiveIntegerField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        ordering = ["-occurred_at", "-id"]
        indexes = [
            models.Index(fields=["tenant", "subject"], name="adminevent_subject"),
            models.Index(fields=["tenant", "occurred_at"], name="adminevent_tenant_time"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "seq"], name="adminevent_unique_seq")
        ]

    # The audit page lists these among run events (console/audit.py): how its rows tell.
    is_admin_event = True

    def __str__(self) -> str:
        return f"{self.event_type} {self.subject} by {self.actor}"

    @property
    def in_words(self) -> str:
        """What changed, as the people page lists it."""
        payload, name = self.payload, self.subject.partition(":")[2]
        if self.event_type == "user.role_changed":
            return f"{name}: role {payload['from']} → {payload['to']}"
        if self.event_type == "policy.published":
            return f"{payload['capability']}: version {payload['version']} published"
        if self.event_type == "api_key.issued":
            scopes = ", ".join(payload["scopes"]) or "no scopes"
            return f"key {payload['name']} ({name}) issued, scopes {scopes}"
        if self.event_type == "api_key.revoked":
            return f"key {payload['name']} ({name}) revoked"
        return f"{self.event_type} {self.subject}"
