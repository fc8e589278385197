"""Tenants, people, API keys, runs, decisions and the append-only event log."""

from __future__ import annotations

from functools import partial

from django.contrib.auth.models import AbstractUser
from django.contrib.sessions.base_session import AbstractBaseSession
from django.db import models
from django.db.models import F
from django.utils import timezone
from django_fsm import FSMModelMixin, transition

from runs import scopes as key_scopes
from runs.actors import ActorPerson

# Registered with this app; kept in their own module (written by runs/admin_events.py).
from runs.admin_event_models import AdminEvent  # noqa: F401
from runs.changes import SavesChangedFields
from runs.ids import new_id
from runs.statefield import StateField


class Tenant(models.Model):
    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    # How long a finished run's runtime rows stay in the hot tables before `archive_runs`
    # (without --older-than) moves them to the archive tables; empty: never.
    archive_after_days = models.PositiveIntegerField(null=True, blank=True, default=30)

    def __str__(self) -> str:
        return self.slug


class User(AbstractUser):
    """A person. Console users belong to one tenant with one role; a superuser may have none."""

    class Role(models.TextChoices):
        VIEWER = "viewer", "Viewer"
        APPROVER = "approver", "Approver"
        ADMIN = "admin", "Admin"

    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="users"
    )
    role = models.CharField(max_length=20, choices=Role.choices, default=Role.VIEWER)

    @property
    def can_decide(self) -> bool:
        return self.role in (self.Role.APPROVER, self.Role.ADMIN)

    @property
    def is_tenant_admin(self) -> bool:
        return self.role == self.Role.ADMIN


class Session(AbstractBaseSession):
    """A console session: Django's row (key, signed data, expiry) with the signed-in person's id
    beside the data, so that a request reads its session and its person with their tenant in
    one statement (runs/sessions.py), not two. Deleting a person deletes their sessions (Django's
    cascade). No constraint in the database: a session saved while its person is being deleted
    must not fail the request; its row then names no one, and the read signs no one in."""

    user = models.ForeignKey(
        User,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        db_constraint=False,
        related_name="+",
    )

    @classmethod
    def get_session_store_class(cls) -> type:
        from runs.sessions import SessionStore

        return SessionStore


class ApiKey(models.Model):
    """An agent's credential. Only a hash of the secret is stored; the key is shown once."""

    id = models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, "key"), editable=False
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="api_keys")
    name = models.CharField(max_length=200)
    # The person on whose behalf the agent acts: never allowed to approve its own requests.
    principal = models.ForeignKey(
        User, null=True, blank=True, on_delete=models.SET_NULL, related_name="api_keys"
    )
    secret_hash = models.CharField(max_length=64, editable=False)
    # The capabilities this key may propose (runs/scopes.py): capability ids, permissions
    # (`payments.refund`), permission groups (`payments.*`) or `*`. Empty: none.
    scopes = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # From then on the key is refused like a revoked one; empty: it does not expire.
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # When an agent last authenticated with it, to the minute (runs/services.api_key_mark_used).
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.id} ({self.name})"

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None and not self.is_expired

    @property
    def state(self) -> str:
        if self.revoked_at is not None:
            return "revoked"
        return "expired" if self.is_expired else "active"

    def may_propose(self, *, capability_id: str, permission: str) -> bool:
        return key_scopes.covers(self.scopes, capability_id=capability_id, permission=permission)


class Run(FSMModelMixin, SavesChangedFields, models.Model):
    """One agent task. Its state changes only through transitions that services log as events."""

    class State(models.TextChoices):
        ACTIVE = "active"
        WAITING = "waiting"
        COMPLETED = "completed"
        COMPLETED_WITH_DEGRADATION = "completed_with_degradation"
        NEEDS_HUMAN = "needs_human"
        FAILED_PERMANENTLY = "failed_permanently"
        CANCELLED = "cancelled"

    OPEN_STATES = (State.ACTIVE, State.WAITING, State.NEEDS_HUMAN)
    # No transition leaves these: reaching one is the run's end (runs/run_end.py cleans up).
    # needs_human is not among them: a person may resume the run from the desk.
    TERMINAL_STATES = (
        State.COMPLETED,
        State.COMPLETED_WITH_DEGRADATION,
        State.FAILED_PERMANENTLY,
        State.CANCELLED,
    )

    id = models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, "run"), editable=False
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="runs")
    title = models.CharField(max_length=200)
    correlation_id = models.CharField(max_length=200, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    state = StateField(default=State.ACTIVE, choices=State.choices, protected=True)
    max_tool_calls = models.PositiveIntegerField(default=50)
    max_attempts = models.PositiveIntegerField(default=200)
    deadline = models.DateTimeField(null=True, blank=True)
    # Set by the agent's Idempotency-Key header: a retried POST finds this run again.
    idempotency_key = models.CharField(max_length=200, blank=True)
    # The agent framework's own id for this conversation (a thread id): starting a run with
    # one that exists answers with that run.
    # NULL, not "": no ref (the unique constraint skips NULLs).
    external_ref = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    request_digest = models.CharField(max_length=64, blank=True)
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # When it reached a terminal state (runs.run_end), and when `archive_runs` moved its
    # runtime rows out of the hot tables; the run row itself stays (its events point at it).
    ended_at = models.DateTimeField(null=True, blank=True)
    archived_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="run_unique_idempotency_key_per_tenant",
            ),
            models.UniqueConstraint(
                fields=["tenant", "external_ref"],
                condition=models.Q(external_ref__isnull=False),
                name="run_unique_external_ref_per_tenant",
            ),
        ]
        indexes = [
            # The desk, the dashboard and /metrics ask for the runs waiting for a person: a
            # handful among thousands, so a partial index of only them (a run enters and leaves
            # this state once or twice in its life; its other updates stay HOT).
            models.Index(
                fields=["tenant"],
                condition=models.Q(state="needs_human"),
                name="run_needs_human",
            ),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def is_open(self) -> bool:
        return self.state in self.OPEN_STATES

    @transition(field=state, source=State.ACTIVE, target=State.WAITING)
    def wait(self) -> None:
        """Nothing can move until an approval or an external answer arrives."""

    @transition(field=state, source=[State.WAITING, State.NEEDS_HUMAN], target=State.ACTIVE)
    def resume(self) -> None:
        pass

    @transition(field=state, source=[State.ACTIVE, State.WAITING], target=State.COMPLETED)
    def complete(self) -> None:
        pass

    @transition(
        field=state,
        source=[State.ACTIVE, State.WAITING],
        target=State.COMPLETED_WITH_DEGRADATION,
    )
    def complete_with_degradation(self) -> None:
        pass

    @transition(field=state, source=[State.ACTIVE, State.WAITING], target=State.NEEDS_HUMAN)
    def hand_to_human(self) -> None:
        pass

    @transition(field=state, source=OPEN_STATES, target=State.FAILED_PERMANENTLY)
    def fail_permanently(self) -> None:
        pass

    @transition(field=state, source=OPEN_STATES, target=State.CANCELLED)
    def cancel(self) -> None:
        pass


class Decision(models.Model):
    """A business judgment the agent formed (not a fact about the world). Never edited:
    a new version supersedes the old one."""

    id = models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, "dec"), editable=False
    )
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="decisions")
    kind = models.CharField(max_length=100)
    content = models.JSONField()
    version = models.PositiveIntegerField(default=1)
    supersedes = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="superseded_by"
    )
    turn_id = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.id} {self.kind} v{self.version}"


# Event types the dashboard and /metrics count (console/metrics.py, console/dashboard.py).
COUNTED_EVENT_TYPES = (
    "tool_call.proposed",
    "tool_call.dispatching",
    "tool_call.result_unknown",
    "tool_call.stale_result_refused",
    "approval.approved",
    "approval.rejected",
)


class Event(models.Model):
    """One typed runtime fact. Append-only: PostgreSQL refuses UPDATE, DELETE and TRUNCATE
    (migration 0002). Each event carries the hash of the run's previous event."""

    id = models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, "evt"), editable=False
    )
    # Indexes are few and named in Meta: every event is one insert into each of them, and
    # PostgreSQL would add a LIKE index beside each indexed text field that nothing uses.
    run = models.ForeignKey(
        Run, on_delete=models.PROTECT, related_name="events", db_index=False
    )  # (run, seq) below serves run lookups
    seq = models.PositiveIntegerField()
    event_type = models.CharField(max_length=100)
    schema_version = models.PositiveSmallIntegerField()
    producer = models.CharField(max_length=100)
    # No database FOREIGN KEY: it checked, at each event's commit, what the run's key already
    # holds. The one write path (runs.events.append) copies the tenant from the event's run,
    # whose own key (kept, checked) points at a tenant its FK protects; a run never changes
    # tenant. The check cost a `SELECT … FOR KEY SHARE` on runs_tenant per event row, ~7 per
    # dispatched call (issue 12). Django's PROTECT still refuses deleting a tenant with events.
    # tests/test_event_tenant_key.py proves what it guarded is still held.
    tenant = models.ForeignKey(
        Tenant,
        on_delete=models.PROTECT,
        related_name="events",
        db_index=False,  # (tenant, recorded_at) below serves tenant lookups
        db_constraint=False,
    )
    # Who caused it: "user:<username>", "api_key:<id>" or "system:<component>".
    actor = models.CharField(max_length=200, blank=True)
    turn_id = models.CharField(max_length=100, blank=True)
    decision_id = models.CharField(max_length=40, blank=True)
    capability_id = models.CharField(max_length=100, blank=True)
    tool_call_id = models.CharField(max_length=40, blank=True)
    approval_id = models.CharField(max_length=40, blank=True)
    correlation_id = models.CharField(max_length=200, blank=True)
    causation_id = models.CharField(max_length=40, blank=True)
    occurred_at = models.DateTimeField()
    recorded_at = models.DateTimeField()
    payload = models.JSONField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        ordering = ["run_id", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="event_unique_seq_per_run"),
            # No unique index on `hash`: the hash covers the event's id, which the primary key
            # keeps unique, so two events with one hash would be a SHA-256 collision. The
            # index was the log's second largest (118 MB at a million events) and, its keys
            # random, touched a random page on every INSERT (runs 0020).
        ]
        indexes = [
            models.Index(fields=["tenant", "recorded_at"]),
            # A tool call's last event (its next event's cause) is one step back from the end.
            models.Index(fields=["tool_call_id", "seq"], name="event_tool_call_seq"),
            # Blank on most events (a call's seven dispatch events carry a decision only if
            # the agent named one, an approval only if one was asked): indexed where set only,
            # so those events write two index entries fewer. A look-up of an id (`= 'apr_…'`)
            # implies `<> ''`, so it still reads these.
            models.Index(
                fields=["decision_id"], condition=~models.Q(decision_id=""), name="event_decision"
            ),
            models.Index(
                fields=["approval_id"], condition=~models.Q(approval_id=""), name="event_approval"
            ),
            models.Index(fields=["correlation_id"], name="event_correlation"),
            # The audit trail, newest first, one page at a time (its keyset cursor is these
            # columns), and a person's events in the same order: actors are matched whole, in
            # any case, with or without their kind ("alice" is "user:alice").
            models.Index(fields=["tenant", "occurred_at", "run", "seq"], name="event_audit"),
            models.Index(
                F("tenant"),
                ActorPerson(),
                F("occurred_at"),
                F("run"),
                F("seq"),
                name="event_person",
            ),
            # The few types the dashboard and /metrics count, by hour and in all: a partial
            # index, so the other events cost it nothing.
            models.Index(
                fields=["tenant", "event_type", "occurred_at"],
                # Approval latency joins on it: with it here, an index-only scan.
                include=["approval_id"],
                condition=models.Q(event_type__in=COUNTED_EVENT_TYPES),
                name="event_counted",
            ),
        ]

    # The audit page lists run events and admin events together (console/audit.py). Said on
    # both: a template's look-up of a missing attribute raises and catches several
    # exceptions per row before it gives up.
    is_admin_event = False

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.event_type}"


class OutboxMessage(models.Model):
    """A Celery message written in the transaction of the state change that calls for it.

    It is published after commit; the task marks it done in its own first transaction. The
    beat sweeper republishes messages left undone (a lost publish, a broker restart), and
    every task is idempotent, so a message published twice does its work once.
    """

    id = models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, "obx"), editable=False
    )
    task = models.CharField(max_length=200)
    args = models.JSONField(default=list)
    available_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    done_at = models.DateTimeField(null=True, blank=True)
    published_count = models.PositiveIntegerField(default=0)
    # The W3C traceparent of the span that wrote the message (null when tracing is off): the
    # publish, whenever it happens, continues that trace (config/telemetry.py).
    # Null, not "": no trace is not an empty trace context.
    traceparent = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001

    class Meta:
        indexes = [
            models.Index(
                fields=["available_at"],
                condition=models.Q(done_at__isnull=True),
                name="outbox_pending_idx",
            )
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.task}{self.args}"


from runs.credential_models import RunCredential  # noqa: E402, F401  (registers the model)
