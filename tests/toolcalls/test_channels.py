"""Chat channels (Slack-compatible incoming webhooks): a new approval, an escalation and a desk
item each post one chat message — the plain-words summary and a link, never a button — to a
real HTTP receiver, through the outbox, retried, and listed in the delivery log."""

from __future__ import annotations

import json

import pytest

from approvals.models import Policy
from config.celery_app import app
from runs.models import OutboxMessage, Tenant, User
from tests.helpers import (
    BIG_REFUND,
    ApiClient,
    WebhookReceiver,
    approval_of,
    logged_in,
    propose,
)
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due, run_until
from tests.toolcalls.test_desk import to_needs_human, unknown_call
from toolcalls.models import Webhook, WebhookDelivery

CHAT_EVENTS = ["approval.requested", "approval.escalated", "desk.item_added"]


@pytest.fixture
def channel(tenant: Tenant, webhook_receiver: WebhookReceiver) -> Webhook:
    return Webhook.objects.create(
        tenant=tenant, kind=Webhook.Kind.SLACK, url=webhook_receiver.url, event_types=CHAT_EVENTS
    )


@pytest.fixture(autouse=True)
def quick_retries(settings) -> None:
    settings.WEBHOOK_RETRY_BASE_SECONDS = 0.05
    settings.COUNTERSIGN_BASE_URL = "https://console.acme.example"


def assert_never_an_action(message: dict) -> None:
    kinds = {block["type"] for block in message["blocks"]}
    assert kinds <= {"section", "context"}, kinds
    assert "button" not in json.dumps(message)


def test_a_new_approval_posts_its_summary_and_a_link_through_the_outbox(
    agent: ApiClient, channel: Webhook, webhook_receiver: WebhookReceiver, sandbox: Sandbox
) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    delivery = WebhookDelivery.objects.get(event_type="approval.requested")
    # Written with the approval, in its transaction; sent by the outbox's task.
    assert OutboxMessage.objects.filter(task="toolcalls.deliver_webhook", args=[delivery.pk])
    assert webhook_receiver.received == []
    run_due()
    (message,) = webhook_receiver.events()
    link = f"https://console.acme.example/approvals/{approval.pk}/"
    summary = approval.summary.replace("250.00 USD", "$250.00")
    assert summary != approval.summary  # money as the console shows it, not as stored
    assert message["text"] == f"Approval needed: {summary} {link}"
    assert summary in message["blocks"][0]["text"]["text"]
    assert f"<{link}|Open the approval to decide>" == message["blocks"][2]["text"]["text"]
    facts = " ".join(element["text"] for element in message["blocks"][1]["elements"])
    assert f"policy v{approval.policy_version}" in facts and "1 person to approve" in facts
    assert_never_an_action(message)
    assert (WebhookDelivery.objects.get(pk=delivery.pk).state, delivery.tool_call_id) == (
        "delivered",
        approval.tool_call_id,
    )


def test_a_signed_webhook_is_not_sent_chat_messages_and_a_channel_not_the_envelope(
    agent: ApiClient,
    tenant: Tenant,
    channel: Webhook,
    webhook_receiver: WebhookReceiver,
    sandbox: Sandbox,
) -> None:
    signed = Webhook.objects.create(
        tenant=tenant, url=webhook_receiver.url, event_types=["approval.requested"]
    )
    approval = approval_of(propose(agent, BIG_REFUND))
    run_due()
    bodies = {
        d.webhook_id: json.loads(d.body) for d in WebhookDelivery.objects.filter(tenant=tenant)
    }
    assert set(bodies[channel.pk]) == {"text", "blocks"}
    assert bodies[signed.pk]["type"] == "approval.requested"
    assert bodies[signed.pk]["data"]["approval_id"] == approval.pk
    assert "Countersign-Signature" in webhook_receiver.received[0].headers


def test_an_escalation_posts_once(
    agent: ApiClient,
    tenant: Tenant,
    channel: Webhook,
    webhook_receiver: WebhookReceiver,
    sandbox: Sandbox,
) -> None:
    Policy.objects.create(
        tenant=tenant,
        capability_id="refund-order-v2",
        version=1,
        rules=[{"name": "all", "when": "amount_cents > 0", "approvers": 1}],
        expiry_seconds=600,
        escalate_before_seconds=3600,
    )
    approval = approval_of(propose(agent, BIG_REFUND))
    assert app.tasks["approvals.escalate"]() == 1
    assert app.tasks["approvals.escalate"]() == 0
    run_due()
    texts = [message["text"] for message in webhook_receiver.events()]
    assert [text.split(":")[0] for text in texts] == ["Approval needed", "Approval expires soon"]
    assert f"/approvals/{approval.pk}/" in texts[1]
    assert WebhookDelivery.objects.get(event_type="approval.escalated").event_id == (
        f"{approval.pk}.escalated"
    )


def test_a_call_handed_to_a_person_posts_a_link_to_its_desk_item(
    agent: ApiClient, channel: Webhook, webhook_receiver: WebhookReceiver, sandbox: Sandbox
) -> None:
    call = unknown_call(agent, sandbox)
    to_needs_human(call)
    delivery = WebhookDelivery.objects.get(event_type="desk.item_added")
    run_until(lambda: WebhookDelivery.objects.get(pk=delivery.pk).state == "delivered")
    (message,) = [m for m in webhook_receiver.events() if "desk" in m["text"]]
    assert f"https://console.acme.example/desk/{call.pk}/" in message["text"]
    assert "Refund" in message["blocks"][0]["text"]["text"]
    assert "look-ups exhausted" in json.dumps(message["blocks"][1])
    assert_never_an_action(message)


def test_a_run_handed_to_a_person_at_expiry_posts_a_link_to_the_run(
    agent: ApiClient,
    tenant: Tenant,
    channel: Webhook,
    webhook_receiver: WebhookReceiver,
    sandbox: Sandbox,
) -> None:
    from approvals.models import Approval
    from toolcalls import gate

    Policy.objects.create(
        tenant=tenant,
        capability_id="refund-order-v2",
        version=1,
        rules=[{"name": "all", "when": "amount_cents > 0", "approvers": 1}],
        on_expiry="hand_to_human",
    )
    call = propose(agent, BIG_REFUND)
    Approval.objects.filter(tool_call_id=call["tool_call_id"]).update(
        expires_at="2000-01-01T00:00:00Z"
    )
    gate.approvals_expire_due()
    run_due()
    (message,) = [m for m in webhook_receiver.events() if "run needs a person" in m["text"]]
    assert f"https://console.acme.example/runs/{call['run_id']}/" in message["text"]
    assert_never_an_action(message)
    delivery = WebhookDelivery.objects.get(event_type="desk.item_added")
    assert (delivery.run_id, delivery.state) == (call["run_id"], "delivered")


def test_a_run_finished_with_an_unknown_outcome_posts_once(
    agent: ApiClient, channel: Webhook, webhook_receiver: WebhookReceiver, sandbox: Sandbox
) -> None:
    call = unknown_call(agent, sandbox)
    response = agent.post(f"/api/v1/runs/{call.run_id}/complete", {})
    assert response.status_code == 200, response.json()
    assert response.json()["state"] == "needs_human"
    delivery = WebhookDelivery.objects.get(event_type="desk.item_added")
    assert (delivery.run_id, delivery.tool_call_id) == (call.run_id, "")
    assert "run needs a person" in json.loads(delivery.body)["text"]


def test_a_failing_receiver_is_tried_again_and_the_log_shows_both_attempts(
    agent: ApiClient,
    admin_user: User,
    channel: Webhook,
    webhook_receiver: WebhookReceiver,
    sandbox: Sandbox,
) -> None:
    webhook_receiver.answers = [503]
    propose(agent, BIG_REFUND)
    delivery = WebhookDelivery.objects.get(event_type="approval.requested")
    run_until(lambda: WebhookDelivery.objects.get(pk=delivery.pk).state == "delivered")
    first, second = webhook_receiver.received
    assert first.body == second.body
    page = logged_in(admin_user).get("/webhooks/").content.decode()
    assert "approval.requested" in page and "HTTP 503" in page and "delivered" in page
    assert channel.url not in page  # the channel's URL is its credential: shown masked
    assert channel.shown_url in page


def test_markup_in_the_arguments_stays_text(
    agent: ApiClient, channel: Webhook, webhook_receiver: WebhookReceiver, sandbox: Sandbox
) -> None:
    from toolcalls.channels import chat_message

    message = chat_message(
        headline="Approval needed",
        summary="Refund <!channel> <https://evil.example|your bank> & more",
        facts=[],
        link="https://console.acme.example/approvals/apr_1/",
        label="Open",
    )
    assert "<!channel>" not in message["blocks"][0]["text"]["text"]
    assert "&lt;!channel&gt;" in message["blocks"][0]["text"]["text"]


# --- the console page -------------------------------------------------------------------------


def test_an_admin_adds_a_channel_and_stops_it(admin_user: User, tenant: Tenant) -> None:
    client = logged_in(admin_user)
    response = client.post(
        "/channels/add/",
        {"url": "https://hooks.example.com/services/T1/B2/x", "events": CHAT_EVENTS[:2]},
    )
    assert response.status_code == 302
    channel = Webhook.objects.get(tenant=tenant)
    assert (channel.kind, channel.event_types) == ("slack", CHAT_EVENTS[:2])
    page = client.get("/channels/").content.decode()
    assert "new approvals, escalations" in page and "hooks.example.com" in page
    assert "T1/B2" not in page  # the URL is the channel's credential: shown masked
    assert client.post(f"/channels/{channel.pk}/stop/").status_code == 302
    assert not Webhook.objects.get(pk=channel.pk).active


def test_a_bad_url_or_no_events_is_refused_beside_the_form(admin_user: User) -> None:
    client = logged_in(admin_user)
    response = client.post("/channels/add/", {"url": "not a url", "events": CHAT_EVENTS})
    assert response.status_code == 422
    assert "url: Enter a valid URL." in response.content.decode()
    assert 'value="not a url"' in response.content.decode()
    response = client.post("/channels/add/", {"url": "https://hooks.example.com/x"})
    assert response.status_code == 422 and "event_types" in response.content.decode()
    assert not Webhook.objects.exists()


def test_a_channel_takes_only_chat_events(admin_user: User) -> None:
    response = logged_in(admin_user).post(
        "/channels/add/", {"url": "https://hooks.example.com/x", "events": ["tool_call.terminal"]}
    )
    assert response.status_code == 422
    assert not Webhook.objects.exists()


def test_approvers_and_other_tenants_cannot_touch_channels(
    approver: User, tenant: Tenant, other_tenant: Tenant
) -> None:
    from tests.helpers import make_user

    assert logged_in(approver).get("/channels/").status_code == 403
    assert logged_in(approver).post("/channels/add/", {"url": "https://x.example"}).status_code == (
        403
    )
    theirs = Webhook.objects.create(
        tenant=other_tenant, kind="slack", url="https://x.example", event_types=CHAT_EVENTS
    )
    ours = make_user("olivia", tenant, User.Role.ADMIN)
    assert logged_in(ours).post(f"/channels/{theirs.pk}/stop/").status_code == 404
    assert Webhook.objects.get(pk=theirs.pk).active
