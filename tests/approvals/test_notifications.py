"""Emails about approvals: to the approvers when one is opened, to the escalation group when
one nears its deadline. Both go through the outbox, at least once, and a send key keeps a
retry or a second delivery from mailing twice (issue #10, point 8)."""

from __future__ import annotations

import smtplib
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import Group
from django.core import mail

from approvals.models import Approval, Policy
from config.celery_app import app
from runs.models import Event, OutboxMessage, Tenant, User
from tests.approvals.mail_backends import FailsOnce, WhileSending
from tests.helpers import BIG_REFUND, ApiClient, approval_of, logged_in, make_user, propose
from tests.sandbox_process import Sandbox
from tests.toolcalls.inline_worker import run_due


@pytest.fixture
def addresses(approver: User, bob: User) -> list[str]:
    """alice and bob, the tenant's approvers, have addresses (the agent's owner has none)."""
    for user in (approver, bob):
        User.objects.filter(pk=user.pk).update(email=f"{user.username}@acme.example")
    return ["alice@acme.example", "bob@acme.example"]


@pytest.fixture
def mail_server(settings) -> Iterator[None]:
    settings.EMAIL_BACKEND = "tests.approvals.mail_backends.FailsOnce"
    FailsOnce.failures_left = 0
    yield
    FailsOnce.failures_left = 0


def notify_message(approval: Approval) -> OutboxMessage:
    return OutboxMessage.objects.get(task="approvals.notify", args=[approval.pk])


def test_approvers_are_emailed_a_link_once(
    agent: ApiClient, addresses: list[str], sandbox: Sandbox
) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    mail.outbox.clear()
    run_due()
    (message,) = mail.outbox
    assert sorted(message.to) == addresses
    assert f"/approvals/{approval.pk}/" in message.body
    # Money as the console shows it, in the subject and the body (the stored summary keeps
    # "250.00 USD": it is hashed into events).
    assert "Refund $250.00 on order order-003" in message.subject
    assert message.body.startswith("Refund $250.00 on order order-003")
    assert "250.00 USD" not in message.subject + message.body
    assert notify_message(approval).done_at is not None
    # Redis delivers the same message again: nobody is mailed twice.
    app.tasks["approvals.notify"](approval.pk, outbox_id=notify_message(approval).pk)
    assert len(mail.outbox) == 1


def test_a_failed_send_leaves_the_message_undone_and_the_next_run_sends_once(
    agent: ApiClient, addresses: list[str], mail_server: None, sandbox: Sandbox
) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    mail.outbox.clear()
    FailsOnce.failures_left = 1
    with pytest.raises(smtplib.SMTPServerDisconnected):
        run_due()
    assert notify_message(approval).done_at is None  # the sweeper publishes it again
    assert mail.outbox == []
    run_due()
    (message,) = mail.outbox
    assert sorted(message.to) == addresses
    assert notify_message(approval).done_at is not None
    run_due()
    app.tasks["approvals.notify"](approval.pk, outbox_id=notify_message(approval).pk)
    assert len(mail.outbox) == 1


def test_a_second_delivery_during_the_send_leaves_it_to_the_first(
    agent: ApiClient, addresses: list[str], settings, sandbox: Sandbox
) -> None:
    settings.EMAIL_BACKEND = "tests.approvals.mail_backends.WhileSending"
    approval = approval_of(propose(agent, BIG_REFUND))
    message = notify_message(approval)
    mail.outbox.clear()
    WhileSending.during = lambda: app.tasks["approvals.notify"](approval.pk, outbox_id=message.pk)
    run_due()
    assert WhileSending.during is None  # the second delivery ran, mid-send
    assert len(mail.outbox) == 1
    assert notify_message(approval).done_at is not None


@pytest.fixture
def leads(tenant: Tenant, other_tenant: Tenant, addresses: list[str]) -> Group:
    """A Django auth group of people: alice and bob of this tenant, and people who are not
    mailed — one without an address, one no longer active, one of another tenant."""
    group = Group.objects.create(name="leads")
    for username in ("alice", "bob"):
        User.objects.get(username=username).groups.add(group)
    make_user("nomail", tenant, User.Role.APPROVER).groups.add(group)
    gone = make_user("gone", tenant, User.Role.APPROVER)
    User.objects.filter(pk=gone.pk).update(email="gone@acme.example", is_active=False)
    gone.groups.add(group)
    outsider = make_user("mallory", other_tenant, User.Role.ADMIN)
    User.objects.filter(pk=outsider.pk).update(email="mallory@globex.example")
    outsider.groups.add(group)
    return group


def escalating_policy(tenant: Tenant, group: str) -> Policy:
    """Approvals expire in 10 minutes and escalate an hour before: at once."""
    return Policy.objects.create(
        tenant=tenant,
        capability_id="refund-order-v2",
        version=1,
        rules=[{"name": "all", "when": "amount_cents > 0", "approvers": 1}],
        expiry_seconds=600,
        escalate_before_seconds=3600,
        escalation_group=group,
    )


def test_escalation_to_a_group_mails_each_member_once_and_running_it_twice_mails_once(
    agent: ApiClient,
    tenant: Tenant,
    leads: Group,
    sandbox: Sandbox,
    django_capture_on_commit_callbacks,
) -> None:
    escalating_policy(tenant, "leads, ops@acme.example, BOB@acme.example, nobody-here")
    approval = approval_of(propose(agent, BIG_REFUND))
    run_due()  # the approvers' email
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):  # as if each beat run committed
        assert app.tasks["approvals.escalate"]() == 1
        assert app.tasks["approvals.escalate"]() == 0
    run_due()
    run_due()
    (message,) = mail.outbox
    assert message.to == ["alice@acme.example", "bob@acme.example", "ops@acme.example"]
    assert message.subject == f"Escalation: approval {approval.pk} expires soon"
    escalated = Event.objects.get(approval_id=approval.pk, event_type="approval.escalated")
    assert escalated.payload["to"] == message.to
    assert escalated.payload["unresolved"] == ["nobody-here"]


def test_an_escalation_whose_send_fails_is_sent_by_the_next_run(
    agent: ApiClient, tenant: Tenant, leads: Group, mail_server: None, sandbox: Sandbox
) -> None:
    escalating_policy(tenant, "leads")
    propose(agent, BIG_REFUND)
    run_due()
    mail.outbox.clear()
    assert app.tasks["approvals.escalate"]() == 1
    FailsOnce.failures_left = 1
    with pytest.raises(smtplib.SMTPServerDisconnected):
        run_due()
    assert mail.outbox == []
    assert app.tasks["approvals.escalate"]() == 0  # decided once; its mail is still owed
    run_due()
    (message,) = mail.outbox
    assert message.to == ["alice@acme.example", "bob@acme.example"]
    run_due()
    assert len(mail.outbox) == 1


def test_the_admin_shows_an_approvals_emails(
    agent: ApiClient, addresses: list[str], sandbox: Sandbox
) -> None:
    approval = approval_of(propose(agent, BIG_REFUND))
    run_due()
    root = User.objects.create_superuser(username="root", password="x")
    page = logged_in(root).get(f"/admin/approvals/approval/{approval.pk}/change/")
    assert page.status_code == 200
    assert "bob@acme.example" in page.content.decode()
