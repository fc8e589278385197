"""Run-scoped credentials: short-lived bearer tokens an agent mints for one run.

A credential acts for the key that minted it, with scopes no wider than the key's, on its run
only, until it expires or the run ends (runs/credentials.py). Only a hash of its secret is
stored; the token is shown once, when it is minted.
"""

from __future__ import annotations

from functools import partial

from django.db import models
from django.utils import timezone

from runs.ids import new_id


class RunCredential(models.Model):
    id = models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, "rcr"), editable=False
    )
    tenant = models.ForeignKey("runs.Tenant", on_delete=models.PROTECT, related_name="+")
    run = models.ForeignKey("runs.Run", on_delete=models.PROTECT, related_name="credentials")
    # The key that minted it: the credential acts for it (its principal, its actor name) and
    # stops working when the key does.
    api_key = models.ForeignKey(
        "runs.ApiKey", on_delete=models.PROTECT, related_name="run_credentials"
    )
    secret_hash = models.CharField(max_length=64, editable=False)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_reason = models.CharField(max_length=200, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["run"],
                condition=models.Q(revoked_at__isnull=True),
                name="run_credential_live_idx",
            )
        ]

    def __str__(self) -> str:
        return f"{self.id} for {self.run_id}"

    @property
    def is_expired(self) -> bool:
        return self.expires_at <= timezone.now()

    @property
    def state(self) -> str:
        if self.revoked_at is not None:
            return "revoked"
        return "expired" if self.is_expired else "active"
