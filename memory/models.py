"""Checkpoints and feedback facts: rows written once, each with its event, never updated.

A checkpoint is where an agent was (DESIGN section 10): a new immutable version at every
write, with its own id. A feedback fact is a person's or an agent's judgment about a run, a
decision, a tool call or an approval; it changes no runtime state. On PostgreSQL both tables
refuse UPDATE (migration 0002), so an id always names the same content.
"""

from __future__ import annotations

from functools import partial

from django.db import models

from runs.ids import new_id
from runs.models import ApiKey, Run, Tenant, User


class Checkpoint(models.Model):
    id = models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, "ckpt"), editable=False
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="checkpoints")
    # The slot in the run (`main`, `planner` …) and the schema family its migrations belong to
    # (memory/schemas.py); the kind is the name unless the agent says otherwise.
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=100)
    # 1, 2, 3 … per (run, name): every write is a new version.
    version = models.PositiveIntegerField()
    schema_version = models.PositiveIntegerField()
    # state, step_index, input, decision_ids, tool_call_ids, budgets, data: as written.
    body = models.JSONField()
    body_digest = models.CharField(max_length=64)
    size_bytes = models.PositiveIntegerField()
    actor = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    # Set once, when the run ends (memory/checkpoints.py, checkpoints_archive): the version
    # is final and read-only. The only column PostgreSQL lets an UPDATE change (0003).
    archived_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run_id", "name", "version"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "name", "version"], name="checkpoint_unique_version"
            )
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.name} v{self.version}"


class Feedback(models.Model):
    class Subject(models.TextChoices):
        RUN = "run"
        DECISION = "decision"
        TOOL_CALL = "tool_call"
        APPROVAL = "approval"

    id = models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, "fb"), editable=False
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="feedback")
    subject_kind = models.CharField(max_length=20, choices=Subject.choices)
    # The decision, tool call or approval it is about (the run's own id for the run).
    subject_id = models.CharField(max_length=40)
    rating = models.PositiveSmallIntegerField(null=True, blank=True)  # 1 (bad) … 5 (good)
    label = models.CharField(max_length=50, blank=True)
    text = models.TextField(blank=True)
    # Who gave it: "user:<username>" or "api_key:<id>", and the row behind it.
    actor = models.CharField(max_length=200)
    user = models.ForeignKey(
        User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    api_key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.id} about {self.subject_kind} {self.subject_id}"
