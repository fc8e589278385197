"""Webhooks: tell a tenant's receivers that an approval was decided or a call reached a
terminal status (docs/agent-api.md, "Webhooks").

A delivery is written, with its outbox message, in the transaction of the change it reports
(`tool_call_terminal` from toolcalls/writes.py), so a change that commits is reported and one
that rolls back is not. A decided approval (`approval_decided`, from toolcalls/gate.py) writes
only an outbox message in its transaction; a task writes its deliveries. A thin task sends each
delivery (`webhook_deliver`): one signed POST per attempt, each logged (status code, error,
duration); anything but a 2xx is tried again with exponential backoff until
WEBHOOK_MAX_ATTEMPTS. Delivery is at least once: receivers dedupe by the body's `id`.

Signature: header `Countersign-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of
"<t>.<body>" with the webhook's secret>`; `countersign.verify_webhook` checks it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import httpx
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from approvals.models import Approval
from runs import outbox
from toolcalls import sql, sql_batch
from toolcalls.envelope import tool_call_out
from toolcalls.webhook_models import Webhook, WebhookAttempt, WebhookDelivery

log = logging.getLogger(__name__)

DELIVER_TASK = "toolcalls.deliver_webhook"
# Writes the deliveries of one decided approval (`approval_decided_fan_out`).
DECIDED_TASK = "toolcalls.approval_decided_webhooks"
SIGNATURE_HEADER = "Countersign-Signature"
EVENT_HEADER = "Countersign-Event"
DELIVERY_HEADER = "Countersign-Delivery"
USER_AGENT = "Countersign-Webhooks/1"
# What an error message of an attempt keeps of the receiver's answer.
ANSWER_EXCERPT = 200


def sign(secret: str, timestamp: int, body: bytes) -> str:
    message = f"{timestamp}.".encode() + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def signature_header(secret: str, body: bytes, timestamp: int) -> str:
    return f"t={timestamp},v1={sign(secret, timestamp, body)}"


# --- enqueued with the change they report -----------------------------------------------


def webhooks_enqueue(
    *,
    tenant_id: int,
    event_type: str,
    event_id: str,
    data: Callable[[], dict[str, Any]],
    tool_call_id: str = "",
    run_id: str = "",
    message: Callable[[], dict[str, Any]] | None = None,
) -> list[WebhookDelivery]:
    """One delivery per active webhook of the tenant that wants `event_type`, each with its
    outbox message, in the caller's transaction. `data` is only computed when one does.
    Chat channels get `message()` (toolcalls/channels.py) instead; without one they get
    nothing."""
    hooks = [
        hook
        for hook in _active_hooks(tenant_id)
        if event_type in hook.event_types
        and (hook.kind != Webhook.Kind.SLACK or message is not None)
    ]
    if not hooks:
        return []
    bodies: dict[str, str] = {}

    def body_for(kind: str) -> str:
        if kind not in bodies:
            content = (
                message()
                if kind == Webhook.Kind.SLACK and message is not None
                else {
                    "id": event_id,
                    "type": event_type,
                    "created_at": timezone.now(),
                    "data": data(),
                }
            )
            bodies[kind] = json.dumps(content, cls=DjangoJSONEncoder, separators=(",", ":"))
        return bodies[kind]

    deliveries = []
    for hook in hooks:
        body = body_for(hook.kind)
        delivery = WebhookDelivery.objects.create(
            webhook=hook,
            tenant_id=tenant_id,
            event_type=event_type,
            event_id=event_id,
            tool_call_id=tool_call_id,
            run_id=run_id,
            body=body,
        )
        outbox.enqueue(DELIVER_TASK, delivery.pk)
        deliveries.append(delivery)
    return deliveries


_local = threading.local()


@contextmanager
def hooks_read_once() -> Iterator[None]:
    """Inside one transaction of a dispatch batch: each tenant's active webhooks are read once
    for all its calls, not once per call that reaches a terminal status (the read was one
    statement and ~1 ms of worker CPU per call, profile_dispatch --profile). The block writes
    no webhook, so the first read holds for the rest of it."""
    if getattr(_local, "hooks", None) is not None:
        yield
        return
    _local.hooks = {}
    try:
        yield
    finally:
        _local.hooks = None


def _active_hooks(tenant_id: int) -> list[Webhook]:
    cache: dict[int, list[Webhook]] | None = getattr(_local, "hooks", None)
    if cache is not None and tenant_id in cache:
        return cache[tenant_id]
    hooks = sql_batch.active_webhooks(tenant_id)
    if cache is not None:
        cache[tenant_id] = hooks
    return hooks


def tool_call_terminal(call: Any, *, event_id: str) -> None:
    """The call reached succeeded, failed, rejected, expired or cancelled (its transition's
    event is `event_id`)."""
    webhooks_enqueue(
        tenant_id=call.tenant_id,
        event_type=Webhook.EventType.TOOL_CALL_TERMINAL,
        event_id=event_id,
        data=lambda: {"tool_call": tool_call_out(call)},
        tool_call_id=call.id,
        run_id=call.run_id,
    )


def approval_decided(approval: Any, call: Any, *, wanted: bool | None = None) -> None:
    """People approved or rejected `approval` (or an approver's edit needs nobody else), in
    the decision's transaction. Only the fact is written here, as one outbox message when a
    receiver wants it: the call's envelope and the deliveries are built by a task
    (`approval_decided_fan_out`), off the approver's request, which they made 5 queries
    longer (bench_approve). `wanted`: whether a receiver wants it, when the caller read that
    with its lock (toolcalls/sql_decision.py, lock_for_decision); None: asked here."""
    if wanted is None:
        wanted = sql.receivers_want(
            tenant_id=call.tenant_id,
            event_type=Webhook.EventType.APPROVAL_DECIDED,
            except_kind=Webhook.Kind.SLACK,  # chat channels get no approval.decided (no message)
        )
    if wanted:
        outbox.enqueue(DECIDED_TASK, approval.pk)


def approval_decided_fan_out(*, approval_id: str, outbox_id: str | None = None) -> None:
    """The deliveries of one decided approval, with the call's envelope as it is now (it has
    followed the decision, and may have gone further since: it says what happens next)."""
    with transaction.atomic():
        outbox.mark_done(outbox_id)
        # Locked: two copies of the message (a republish) write the deliveries once.
        approval = (
            Approval.objects.select_for_update(of=("self",))
            .select_related("tool_call")
            .filter(pk=approval_id)
            .first()
        )
        event_id = f"{approval_id}.decided"
        if (
            approval is None
            or WebhookDelivery.objects.filter(
                tenant_id=approval.tenant_id, event_id=event_id
            ).exists()
        ):
            return
        call = approval.tool_call
        envelope = tool_call_out(call)
        webhooks_enqueue(
            tenant_id=call.tenant_id,
            event_type=Webhook.EventType.APPROVAL_DECIDED,
            event_id=event_id,
            data=lambda: {
                "approval_id": approval.pk,
                "outcome": (envelope["decision"] or {}).get("outcome", approval.state),
                "tool_call": envelope,
            },
            tool_call_id=call.pk,
            run_id=call.run_id,
        )


# --- sent by the task ---------------------------------------------------------------------


def webhook_deliver(*, delivery_id: str, outbox_id: str | None = None) -> None:
    """One attempt: claim the delivery, POST it signed, then record the attempt and either
    finish or schedule the next one, with the outbox message marked done in that transaction
    (a worker that dies mid-send leaves it for the sweeper to publish again)."""
    delivery = WebhookDelivery.objects.select_related("webhook").filter(pk=delivery_id).first()
    if delivery is None or delivery.state != WebhookDelivery.State.PENDING:
        _mark_done(outbox_id)  # delivered already: a duplicate message
        return
    if not delivery.webhook.active:
        with transaction.atomic():
            outbox.mark_done(outbox_id)
            WebhookDelivery.objects.filter(pk=delivery.pk, state=delivery.state).update(
                state=WebhookDelivery.State.CANCELLED
            )
        return
    now = timezone.now()
    if delivery.next_attempt_at and delivery.next_attempt_at > now + timedelta(milliseconds=100):
        return  # Early: the message scheduled for next_attempt_at will come.
    holding = settings.WEBHOOK_TIMEOUT_SECONDS + settings.LEASE_MARGIN_SECONDS
    lease = now + timedelta(seconds=holding)
    claimed = (
        WebhookDelivery.objects.filter(pk=delivery.pk, state=WebhookDelivery.State.PENDING)
        .filter(Q(claimed_until=None) | Q(claimed_until__lt=now))
        .update(claimed_until=lease)
    )
    if claimed != 1:
        return  # Another worker is sending it; its message records the attempt.
    started = time.monotonic()
    status_code, error = _post(delivery)
    duration_ms = round((time.monotonic() - started) * 1000)
    with transaction.atomic():
        outbox.mark_done(outbox_id)
        locked = WebhookDelivery.objects.select_for_update().get(pk=delivery.pk)
        _record_attempt(locked, now, duration_ms, status_code, error)


def _mark_done(outbox_id: str | None) -> None:
    with transaction.atomic():
        outbox.mark_done(outbox_id)


def _post(delivery: WebhookDelivery) -> tuple[int | None, str]:
    body = delivery.body.encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        SIGNATURE_HEADER: signature_header(delivery.webhook.secret, body, int(time.time())),
        EVENT_HEADER: delivery.event_type,
        DELIVERY_HEADER: delivery.pk,
    }
    try:
        response = httpx.post(
            delivery.webhook.url,
            content=body,
            headers=headers,
            timeout=settings.WEBHOOK_TIMEOUT_SECONDS,
            follow_redirects=False,
        )
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"[:500]
    if 200 <= response.status_code < 300:
        return response.status_code, ""
    return response.status_code, f"HTTP {response.status_code}: {response.text[:ANSWER_EXCERPT]}"


def backoff(attempts: int) -> float:
    """Seconds before the next attempt: doubling from WEBHOOK_RETRY_BASE_SECONDS, capped, with
    jitter so that receivers that were down are not all called back at once."""
    delay = settings.WEBHOOK_RETRY_BASE_SECONDS * 2 ** (attempts - 1)
    return min(delay, settings.WEBHOOK_RETRY_MAX_SECONDS) * random.uniform(0.8, 1.2)


def _record_attempt(
    delivery: WebhookDelivery,
    started_at: Any,
    duration_ms: int,
    status_code: int | None,
    error: str,
) -> None:
    number = delivery.attempts + 1
    WebhookAttempt.objects.create(
        delivery=delivery,
        number=number,
        started_at=started_at,
        duration_ms=duration_ms,
        status_code=status_code,
        error=error,
    )
    delivery.attempts, delivery.claimed_until = number, None
    if not error:
        delivery.state, delivery.delivered_at = WebhookDelivery.State.DELIVERED, timezone.now()
    elif number >= settings.WEBHOOK_MAX_ATTEMPTS:
        delivery.state = WebhookDelivery.State.FAILED
        log.warning("webhook %s: %s failed %d times; giving up", delivery.pk, error, number)
    else:
        delay = backoff(number)
        delivery.next_attempt_at = timezone.now() + timedelta(seconds=delay)
        outbox.enqueue(DELIVER_TASK, delivery.pk, countdown=delay)
    delivery.save()
