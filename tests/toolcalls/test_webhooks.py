"""Webhooks for approval.decided and tool_call.terminal: enqueued with the change, sent signed
to a real HTTP receiver, retried with backoff, every attempt in the console's log."""

from __future__ import annotations

import hashlib
import hmac
import time
from io import StringIO

import pytest
from django.core.management import call_command

from runs.models import OutboxMessage, Tenant, User
from tests.helpers import (
    BIG_REFUND,
    ApiClient,
    Received,
    WebhookReceiver,
    approval_of,
    decide,
    free_port,
    logged_in,
    propose,
)
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due, run_until
from toolcalls import webhooks
from toolcalls.models import Webhook, WebhookAttempt, WebhookDelivery

BOTH = ["approval.decided", "tool_call.terminal"]


@pytest.fixture
def webhook(tenant: Tenant, webhook_receiver: WebhookReceiver) -> Webhook:
    return Webhook.objects.create(tenant=tenant, url=webhook_receiver.url, event_types=BOTH)


@pytest.fixture(autouse=True)
def quick_retries(settings) -> None:
    settings.WEBHOOK_RETRY_BASE_SECONDS = 0.05


def signature_is_valid(received: Received, secret: str, tolerance: int = 300) -> bool:
    """The receiver's check, written out: t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">."""
    parts = dict(
        item.split("=", 1) for item in received.headers["Countersign-Signature"].split(",")
    )
    signed = parts["t"].encode() + b"." + received.body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    fresh = abs(time.time() - int(parts["t"])) <= tolerance
    return fresh and hmac.compare_digest(expected, parts["v1"])


def cancel(agent: ApiClient, call: dict) -> None:
    response = agent.post(f"/api/v1/tool-calls/{call['tool_call_id']}/cancel")
    assert response.status_code == 200, response.json()


def test_a_decided_approval_and_a_terminal_call_each_deliver_one_signed_post(
    agent: ApiClient,
    approver: User,
    webhook: Webhook,
    webhook_receiver: WebhookReceiver,
    sandbox: Sandbox,
) -> None:
    call = propose(agent, BIG_REFUND)
    decide(logged_in(approver), approval_of(call), "approve", reason="duplicate charge, ok")
    # Written with the decision, in its transaction: the fan-out's outbox message, whose task
    # writes the deliveries off the approver's request; nothing is sent before it commits.
    approval = approval_of(call)
    assert OutboxMessage.objects.filter(
        task="toolcalls.approval_decided_webhooks", args=[approval.pk]
    ).exists()
    assert not WebhookDelivery.objects.exists()
    assert webhook_receiver.received == []
    run_due()  # the dispatch, the verification, the fan-out and the deliveries
    # Sent by different tasks (workers), so in no promised order.
    assert sorted(e["type"] for e in webhook_receiver.events()) == BOTH
    for received in webhook_receiver.received:
        assert signature_is_valid(received, webhook.secret)
        assert received.headers["Content-Type"] == "application/json"
    by_type = {e["type"]: e for e in webhook_receiver.events()}
    approval_event, terminal_event = by_type["approval.decided"], by_type["tool_call.terminal"]
    assert approval_event["data"]["outcome"] == "approved"
    assert approval_event["data"]["tool_call"]["decision"]["by"] == ["alice"]
    assert approval_event["data"]["tool_call"]["tool_call_id"] == call["tool_call_id"]
    assert terminal_event["data"]["tool_call"]["status"] == "succeeded"
    assert terminal_event["data"]["tool_call"]["result"]["amount_cents"] == 25000
    [headers] = [
        r.headers
        for r in webhook_receiver.received
        if r.headers["Countersign-Event"] == "tool_call.terminal"
    ]
    delivery = WebhookDelivery.objects.get(pk=headers["Countersign-Delivery"])
    assert (delivery.state, delivery.attempts) == ("delivered", 1)
    assert list(WebhookAttempt.objects.values_list("status_code", flat=True)) == [200, 200]


def test_a_rejection_is_decided_and_terminal(
    agent: ApiClient,
    approver: User,
    webhook: Webhook,
    webhook_receiver: WebhookReceiver,
    sandbox: Sandbox,
) -> None:
    call = propose(agent, BIG_REFUND)
    decide(logged_in(approver), approval_of(call), "reject", reason="not eligible")
    run_due()
    events = {e["type"]: e["data"] for e in webhook_receiver.events()}
    assert set(events) == set(BOTH)
    assert events["approval.decided"]["outcome"] == "rejected"
    assert events["tool_call.terminal"]["tool_call"]["decision"]["reason"] == "not eligible"
    assert events["tool_call.terminal"]["tool_call"]["status"] == "rejected"


def test_a_receiver_answering_500_gets_a_retry_and_the_log_shows_both(
    agent: ApiClient, webhook: Webhook, webhook_receiver: WebhookReceiver, sandbox: Sandbox
) -> None:
    webhook_receiver.answers = [500]
    call = propose(agent, BIG_REFUND)
    cancel(agent, call)
    delivery = WebhookDelivery.objects.get(event_type="tool_call.terminal")
    run_until(lambda: WebhookDelivery.objects.get(pk=delivery.pk).state == "delivered")
    first, second = webhook_receiver.received
    assert first.body == second.body  # the same event, signed afresh
    assert first.headers["Countersign-Delivery"] == second.headers["Countersign-Delivery"]
    assert signature_is_valid(second, webhook.secret)
    attempts = list(WebhookAttempt.objects.filter(delivery=delivery).order_by("number"))
    assert [(a.number, a.status_code) for a in attempts] == [(1, 500), (2, 200)]
    assert attempts[0].error.startswith("HTTP 500")
    assert attempts[1].error == ""
    assert all(a.duration_ms >= 0 for a in attempts)


def test_it_gives_up_after_the_last_attempt(
    agent: ApiClient, tenant: Tenant, settings, sandbox: Sandbox
) -> None:
    settings.WEBHOOK_MAX_ATTEMPTS = 2
    nobody = f"http://127.0.0.1:{free_port()}/gone"
    Webhook.objects.create(tenant=tenant, url=nobody, event_types=["tool_call.terminal"])
    cancel(agent, propose(agent, BIG_REFUND))
    delivery = WebhookDelivery.objects.get()
    run_until(lambda: WebhookDelivery.objects.get(pk=delivery.pk).state == "failed")
    attempts = list(WebhookAttempt.objects.filter(delivery=delivery))
    assert [a.status_code for a in attempts] == [None, None]
    assert "ConnectError" in attempts[0].error
    assert not OutboxMessage.objects.filter(done_at=None).exists()


def test_only_active_webhooks_of_the_tenant_that_want_the_event_are_called(
    agent: ApiClient,
    tenant: Tenant,
    other_tenant: Tenant,
    webhook_receiver: WebhookReceiver,
    sandbox: Sandbox,
) -> None:
    url = webhook_receiver.url
    Webhook.objects.create(tenant=tenant, url=url, event_types=["approval.decided"])
    Webhook.objects.create(tenant=tenant, url=url, event_types=BOTH, active=False)
    Webhook.objects.create(tenant=other_tenant, url=url, event_types=BOTH)
    cancel(agent, propose(agent, BIG_REFUND))
    run_due()
    assert WebhookDelivery.objects.count() == 0
    assert webhook_receiver.received == []


def test_a_webhook_deactivated_before_delivery_is_not_called(
    agent: ApiClient, webhook: Webhook, webhook_receiver: WebhookReceiver, sandbox: Sandbox
) -> None:
    cancel(agent, propose(agent, BIG_REFUND))
    Webhook.objects.filter(pk=webhook.pk).update(active=False)
    run_due()
    assert WebhookDelivery.objects.get().state == "cancelled"
    assert webhook_receiver.received == []


def test_admins_see_the_delivery_log(
    agent: ApiClient,
    admin_user: User,
    approver: User,
    webhook: Webhook,
    webhook_receiver: WebhookReceiver,
    sandbox: Sandbox,
) -> None:
    webhook_receiver.answers = [503]
    cancel(agent, propose(agent, BIG_REFUND))
    delivery = WebhookDelivery.objects.get()
    run_until(lambda: WebhookDelivery.objects.get(pk=delivery.pk).state == "delivered")
    page = logged_in(admin_user).get("/webhooks/")
    assert page.status_code == 200
    html = page.content.decode()
    assert delivery.pk in html and "tool_call.terminal" in html
    assert "503" in html and "200" in html and webhook_receiver.url in html
    assert logged_in(approver).get("/webhooks/").status_code == 403


def test_another_tenants_deliveries_are_not_listed(
    agent: ApiClient, other_tenant: Tenant, webhook: Webhook, sandbox: Sandbox
) -> None:
    cancel(agent, propose(agent, BIG_REFUND))
    stranger = User.objects.create_user("mallory", tenant=other_tenant, role=User.Role.ADMIN)
    html = logged_in(stranger).get("/webhooks/").content.decode()
    assert WebhookDelivery.objects.get().pk not in html


def test_create_webhook_prints_the_secret(tenant: Tenant) -> None:
    out = StringIO()
    call_command(
        "create_webhook", "--tenant", "acme", "--url", "https://hooks.example.com/cs", stdout=out
    )
    webhook = Webhook.objects.get()
    assert out.getvalue().strip() == webhook.secret
    assert webhook.secret.startswith("whsec_")
    assert webhook.event_types == BOTH


def test_the_decided_fan_out_writes_its_deliveries_once_when_its_message_comes_twice(
    agent: ApiClient, approver: User, webhook: Webhook, sandbox: Sandbox
) -> None:
    call = propose(agent, BIG_REFUND)
    approval = approval_of(call)
    decide(logged_in(approver), approval, "approve")
    # A republished message: the same task twice (the first one's outbox row marked done).
    webhooks.approval_decided_fan_out(approval_id=approval.pk)
    webhooks.approval_decided_fan_out(approval_id=approval.pk)
    delivery = WebhookDelivery.objects.get(event_type="approval.decided")
    assert delivery.event_id == f"{approval.pk}.decided"
    assert '"outcome":"approved"' in delivery.body


def test_no_fan_out_is_enqueued_when_no_receiver_wants_decisions(
    agent: ApiClient, approver: User, tenant: Tenant, sandbox: Sandbox
) -> None:
    Webhook.objects.create(
        tenant=tenant, url="https://x.example", event_types=["tool_call.terminal"]
    )
    Webhook.objects.create(
        tenant=tenant, url="https://y.example", event_types=BOTH, kind=Webhook.Kind.SLACK
    )
    decide(logged_in(approver), approval_of(propose(agent, BIG_REFUND)), "approve")
    assert not OutboxMessage.objects.filter(task="toolcalls.approval_decided_webhooks").exists()
