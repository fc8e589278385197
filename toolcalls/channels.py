"""Chat channels: a tenant's Slack-compatible incoming webhooks hear about what people are
asked to look at — a new approval, an escalation, a call handed to a person on the desk, a
call whose outcome is still unknown past its consistency window.

A channel is a `Webhook` of kind `slack`; its deliveries are ordinary webhook deliveries
(written with their outbox message in the transaction of the change, retried with backoff,
every attempt in the console's delivery log, toolcalls/webhooks.py). Only the body differs: a
chat message, `{"text": ..., "blocks": [...]}`, with the plain-words summary and a link to the
page where a person decides. Never a button: deciding happens on the page, signed in, where
the stale-form and quorum rules hold.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.urls import reverse

from approvals import notifications
from approvals.models import Approval
from runs.errors import DomainError, not_found
from runs.models import Event, Run, Tenant, User
from runs.money import summary_text
from toolcalls import capabilities, errors, webhooks
from toolcalls.envelope import tool_call_out
from toolcalls.models import ToolCall
from toolcalls.webhook_models import Webhook, WebhookDelivery

log = logging.getLogger(__name__)

EventType = Webhook.EventType


def page_link(view: str, *args: str) -> str:
    return settings.COUNTERSIGN_BASE_URL.rstrip("/") + reverse(view, args=list(args))


def escape(text: str) -> str:
    """Slack's three control characters. The summary quotes an agent's arguments: escaped,
    `<!channel>` or `<https://evil|your bank>` in them stay text, never a mention or a link."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def chat_message(*, headline: str, summary: str, facts: list[str], link: str, label: str) -> dict:
    """A Slack-compatible message: `text` for notifications and clients without blocks, and
    blocks with the same words. Sections and context only — no `actions` block."""
    return {
        "text": f"{headline}: {summary} {link}",
        "blocks": [
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": f"*{escape(headline)}*\n{escape(summary)}"},
            },
            {
                "type": "context",
                "elements": [{"type": "mrkdwn", "text": escape(fact)} for fact in facts],
            },
            {"type": "section", "text": {"type": "mrkdwn", "text": f"<{link}|{escape(label)}>"}},
        ],
    }


def _approval_facts(approval: Approval) -> list[str]:
    people = "person" if approval.required_approvers == 1 else "people"
    return [
        f"Rule: {approval.rule_name} (policy v{approval.policy_version}), "
        f"{approval.required_approvers} {people} to approve, risk {approval.risk}",
        f"Expires {approval.expires_at:%Y-%m-%d %H:%M} UTC",
    ]


def _approval_event(approval: Approval, call: ToolCall, event_type: str, headline: str) -> None:
    link = page_link("approvals:detail", approval.pk)
    webhooks.webhooks_enqueue(
        tenant_id=approval.tenant_id,
        event_type=event_type,
        event_id=f"{approval.pk}.{event_type.split('.')[1]}",
        data=lambda: {
            "approval_id": approval.pk,
            "summary": approval.summary,
            "url": link,
            "tool_call": tool_call_out(call),
        },
        message=lambda: chat_message(
            headline=headline,
            summary=summary_text(approval.summary, approval.args),
            facts=_approval_facts(approval),
            link=link,
            label="Open the approval to decide",
        ),
        tool_call_id=call.pk,
        run_id=call.run_id,
    )


def approval_requested(approval: Approval, call: ToolCall) -> None:
    """A new approval waits for people (toolcalls/gate.py, in its transaction)."""
    _approval_event(approval, call, EventType.APPROVAL_REQUESTED, "Approval needed")


def approval_escalated(approval: Approval) -> None:
    """An approval is close to its deadline (approvals/notifications.py calls it, registered
    below, in the transaction that records the escalation)."""
    headline = "Approval expires soon"
    _approval_event(approval, approval.tool_call, EventType.APPROVAL_ESCALATED, headline)


notifications.on_escalation(approval_escalated)


def _summary(call: ToolCall) -> str:
    capability = capabilities.get(call.capability_id)
    if capability is None:
        return f"{call.capability_id} {call.object_ref}"
    return summary_text(capability.summary(call.args), call.args)


def desk_item_added(call: ToolCall, *, event_id: str, reason: str = "") -> None:
    """A call was handed to a person: its outcome is unknown and look-ups did not settle it
    (toolcalls/writes.py, in the transaction of the transition)."""
    link = page_link("desk:item", call.pk)
    why = reason or call.last_error_message or call.last_error_name or "the outcome is unknown"
    webhooks.webhooks_enqueue(
        tenant_id=call.tenant_id,
        event_type=EventType.DESK_ITEM_ADDED,
        event_id=event_id,
        data=lambda: {"url": link, "tool_call": tool_call_out(call)},
        message=lambda: chat_message(
            headline="A call needs a person on the unknowns desk",
            summary=_summary(call),
            facts=[f"Why: {why}", f"Run {call.run_id}, call {call.pk}"],
            link=link,
            label="Open the desk item",
        ),
        tool_call_id=call.pk,
        run_id=call.run_id,
    )


def call_still_unknown(call: ToolCall, *, event_id: str, since: datetime, problem: str) -> None:
    """A call's outcome is still unknown past its consistency window because its look-ups
    fail (the system unreachable or erring): the refund may have gone through, or not, and
    nothing will settle it until the system answers. Operators hear of it once per call, at
    the first such look-up (toolcalls/reconcile.py, in its transaction, with the call
    locked), not at every retry and not for calls the next look-up settles within seconds;
    if look-ups run out, the hand-over to a person posts `desk.item_added` as well."""
    event_type = EventType.TOOL_CALL_STILL_UNKNOWN
    wanted = [
        hook.pk
        for hook in Webhook.objects.filter(tenant_id=call.tenant_id, active=True)
        if event_type in hook.event_types
    ]
    already = WebhookDelivery.objects.filter(
        webhook_id__in=wanted, tool_call_id=call.pk, event_type=event_type
    )
    if not wanted or already.exists():
        return
    link = page_link("desk:item", call.pk)
    facts = [
        f"Unknown since {since:%Y-%m-%d %H:%M:%S} UTC; look-up {call.lookups} failed: {problem}",
        "Not sent again until a look-up answers; a person gets it if look-ups run out",
        f"Run {call.run_id}, call {call.pk}",
    ]
    webhooks.webhooks_enqueue(
        tenant_id=call.tenant_id,
        event_type=event_type,
        event_id=event_id,
        data=lambda: {"url": link, "problem": problem, "tool_call": tool_call_out(call)},
        message=lambda: chat_message(
            headline="A call's outcome is still unknown",
            summary=_summary(call),
            facts=facts,
            link=link,
            label="Open the desk item",
        ),
        tool_call_id=call.pk,
        run_id=call.run_id,
    )


def desk_run_added(run: Run, *, reason: str) -> None:
    """A run was handed to a person (an approval expired under a hand-to-human policy, or the
    agent finished with outcomes unknown): it is on the desk, in the same transaction."""
    link = page_link("runs:detail", run.pk)
    # The id of the run's latest event, the hand-over just appended: what receivers dedupe by.
    event_id = Event.objects.filter(run=run).order_by("-seq").values_list("id", flat=True)[0]
    webhooks.webhooks_enqueue(
        tenant_id=run.tenant_id,
        event_type=EventType.DESK_ITEM_ADDED,
        event_id=event_id,
        data=lambda: {"url": link, "run_id": run.pk, "title": run.title, "reason": reason},
        message=lambda: chat_message(
            headline="A run needs a person on the unknowns desk",
            summary=run.title,
            facts=[f"Why: {reason or 'its outcome is unknown'}", f"Run {run.pk}"],
            link=link,
            label="Open the run",
        ),
        run_id=run.pk,
    )


# --- channels of a tenant, added and removed by its admins -----------------------------------


def channel_add(*, tenant: Tenant, url: str, event_types: list[str], by: User) -> Webhook:
    """A new chat channel; 422 `channel.invalid` with the problem when the URL or the events
    are not ones it can take."""
    channel = Webhook(tenant=tenant, kind=Webhook.Kind.SLACK, url=url, event_types=event_types)
    try:
        channel.full_clean()
    except ValidationError as exc:
        problems = [f"{field}: {' '.join(texts)}" for field, texts in exc.message_dict.items()]
        raise DomainError(errors.CHANNEL_INVALID, "; ".join(problems), status=422) from exc
    channel.save()
    log.info("chat channel %s added for %s by %s", channel.pk, tenant.slug, by.username)
    return channel


def channel_deactivate(*, tenant: Tenant, channel_id: str, by: User) -> Webhook:
    """Stop sending to a channel; deliveries not sent yet are cancelled when their turn
    comes (webhooks.webhook_deliver)."""
    channel = Webhook.objects.filter(tenant=tenant, pk=channel_id).first()
    if channel is None:
        raise not_found("channel", channel_id)
    Webhook.objects.filter(pk=channel.pk).update(active=False)
    channel.active = False
    log.info("webhook %s deactivated for %s by %s", channel.pk, tenant.slug, by.username)
    return channel


def channel_list(*, tenant: Tenant) -> list[Webhook]:
    return list(Webhook.objects.filter(tenant=tenant).order_by("-active", "-created_at"))


def describe(event_types: list[str]) -> str:
    words = {
        EventType.APPROVAL_REQUESTED: "new approvals",
        EventType.APPROVAL_ESCALATED: "escalations",
        EventType.DESK_ITEM_ADDED: "desk items",
        EventType.TOOL_CALL_STILL_UNKNOWN: "calls still unknown past their consistency window",
        EventType.APPROVAL_DECIDED: "decided approvals",
        EventType.TOOL_CALL_TERMINAL: "finished calls",
    }
    return ", ".join(words.get(event, event) for event in event_types)
