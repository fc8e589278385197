"""Admin events (a role changed, an API key issued or revoked, a policy published) on the
audit page and in its export, found by the same filters as run events, each once across
pages; and their own hash chain per tenant, which `verify_event_chain` checks."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction

from console import audit
from console.views import ops
from runs import services as run_services
from runs.admin_events import admin_event_append, verify_admin_chain
from runs.events import GENESIS_HASH
from runs.models import AdminEvent, Run, Tenant, User
from tests.helpers import logged_in, make_user

AGENT = "api_key:key_test"


@pytest.fixture
def changes(tenant: Tenant, admin_user: User, approver: User, other_tenant: Tenant) -> dict:
    """olivia makes alice an admin, issues a key and revokes it; Globex's admin does the same
    kind of things in Globex."""
    role = run_services.user_change_role(
        tenant=tenant, username="alice", role="admin", by=admin_user
    )
    key, _token = run_services.api_key_issue(
        tenant=tenant, name="refund bot", scopes=["orders.read"], by=admin_user
    )
    run_services.api_key_revoke(api_key=key, by=admin_user)
    globex_admin = make_user("gina", other_tenant, User.Role.ADMIN)
    run_services.api_key_issue(
        tenant=other_tenant, name="globex bot", scopes=["orders.read"], by=globex_admin
    )
    return {"role": role, "key": key}


def page(admin_user: User, **params: str) -> str:
    response = logged_in(admin_user).get("/audit/", params)
    assert response.status_code == 200
    return response.content.decode()


def export(admin_user: User, **params: str) -> list[dict]:
    response = logged_in(admin_user).get("/audit/export/", params)
    return [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]


def test_admin_events_show_on_the_audit_page_in_words(changes: dict, admin_user: User) -> None:
    html = page(admin_user)
    key = changes["key"]
    for event in AdminEvent.objects.filter(tenant=admin_user.tenant):
        assert event.pk in html
    assert "user.role_changed" in html and "alice: role approver → admin" in html
    assert f"key refund bot ({key.pk}) issued, scopes orders.read" in html
    assert f"key refund bot ({key.pk}) revoked" in html
    assert "globex bot" not in html


def test_the_filters_find_admin_events_by_person_id_and_type(
    changes: dict, admin_user: User, tenant: Tenant
) -> None:
    key = changes["key"]
    by_key = page(admin_user, q=key.pk)
    assert "api_key.issued" in by_key and "api_key.revoked" in by_key
    assert "user.role_changed" not in by_key
    by_name = page(admin_user, q="alice")
    assert "user.role_changed" in by_name and "api_key.issued" not in by_name
    assert "api_key.revoked" in page(admin_user, person="olivia")
    assert "api_key.revoked" not in page(admin_user, person="alice")
    by_type = page(admin_user, type="api_key.")
    assert "api_key.issued" in by_type and "user.role_changed" not in by_type
    one = AdminEvent.objects.get(tenant=tenant, event_type="user.role_changed")
    assert one.pk in page(admin_user, q=one.pk)


def test_the_export_holds_each_admin_event_whole(changes: dict, admin_user: User) -> None:
    lines = [line for line in export(admin_user) if line.get("log") == "admin"]
    stored = AdminEvent.objects.filter(tenant=admin_user.tenant).order_by("-occurred_at")
    assert [line["id"] for line in lines] == [event.pk for event in stored]
    revoked = next(line for line in lines if line["event_type"] == "api_key.revoked")
    event = AdminEvent.objects.get(pk=revoked["id"])
    assert (revoked["hash"], revoked["prev_hash"], revoked["seq"]) == (
        event.hash,
        event.prev_hash,
        event.seq,
    )
    assert revoked["subject"] == f"api_key:{changes['key'].pk}"
    assert revoked["actor"] == "user:olivia" and revoked["payload"] == {"name": "refund bot"}
    assert [line["id"] for line in export(admin_user, person="olivia", type="user.")] == [
        AdminEvent.objects.get(tenant=admin_user.tenant, event_type="user.role_changed").pk
    ]


def interleaved(tenant: Tenant, admin_user: User) -> list[str]:
    """Run events and admin events taking turns in time, newest last; their ids."""
    run, _ = run_services.run_start(tenant=tenant, title="busy", actor=AGENT)
    order = [e.pk for e in run.events.order_by("seq")]
    for n in range(12):
        decision = run_services.decision_record(
            tenant=tenant, run_id=run.pk, kind=f"step-{n}", content={}, actor=AGENT
        )
        order.append(run.events.get(decision_id=decision.pk).pk)
        if n % 3 == 0:
            with transaction.atomic():
                admin = admin_event_append(
                    tenant=tenant,
                    event_type="api_key.revoked",
                    subject=f"api_key:key_{n}",
                    payload={"name": f"bot {n}"},
                    by=admin_user,
                )
            order.append(admin.pk)
    return order


def test_pages_interleave_admin_events_by_time_each_once(
    tenant: Tenant, admin_user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ops, "AUDIT_PAGE_SIZE", 4)
    expected = list(reversed(interleaved(tenant, admin_user)))
    seen: list[str] = []
    params: dict[str, str] = {}
    while True:
        response = logged_in(admin_user).get("/audit/", params)
        rows = response.context["events"]
        seen += [row["id"] for row in rows]
        if not response.context["older"]:
            break
        params = {"before": response.context["older"]}
    assert seen == expected


def test_export_chunks_interleave_admin_events_by_time_each_once(
    tenant: Tenant, admin_user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit, "EXPORT_CHUNK_SIZE", 3)
    monkeypatch.setattr(audit, "EXPORT_FIRST_CHUNK", 3)
    expected = list(reversed(interleaved(tenant, admin_user)))
    assert [line["id"] for line in export(admin_user)] == expected


# --- the chain ------------------------------------------------------------------------------


def test_each_tenants_admin_events_are_chained_in_order(changes: dict, tenant: Tenant) -> None:
    chain = list(AdminEvent.objects.filter(tenant=tenant).order_by("seq"))
    assert [event.seq for event in chain] == [1, 2, 3]
    assert chain[0].prev_hash == GENESIS_HASH
    assert [event.prev_hash for event in chain[1:]] == [event.hash for event in chain[:-1]]
    assert verify_admin_chain() == ([], 4)
    call_command("verify_event_chain")


@contextmanager
def maintenance() -> Iterator[None]:
    """A maintenance session: the only way past the append-only trigger."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL countersign.allow_event_rewrite = 'on'")
        yield


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE runs_adminevent SET payload = '{}'",
        "DELETE FROM runs_adminevent WHERE seq = (SELECT max(seq) FROM runs_adminevent)",
        "TRUNCATE runs_adminevent",
    ],
)
def test_the_database_refuses_to_rewrite_admin_events(changes: dict, statement: str) -> None:
    # Deleting the newest row is what the chain alone cannot see: nothing links to it.
    with (
        pytest.raises(DatabaseError, match="runs_adminevent is append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(statement)
    assert AdminEvent.objects.count() == 4
    assert verify_admin_chain() == ([], 4)


def test_changing_one_admin_event_is_detected(changes: dict, tenant: Tenant) -> None:
    issued = AdminEvent.objects.get(tenant=tenant, event_type="api_key.issued")
    # Someone with database access, past the append-only trigger, widens what the record
    # says the key was given.
    with maintenance():
        AdminEvent.objects.filter(pk=issued.pk).update(
            payload={"name": "refund bot", "scopes": ["*"]}
        )
    problems, _ = verify_admin_chain()
    assert problems == [
        f"admin tenant {tenant.pk}#2 ({issued.pk}): content does not match its hash "
        "(changed after writing)"
    ]
    with pytest.raises(CommandError, match="1 problems in 0 events and 4 admin events"):
        call_command("verify_event_chain")


def test_removing_one_admin_event_is_detected(changes: dict, tenant: Tenant) -> None:
    with maintenance():
        AdminEvent.objects.filter(tenant=tenant, seq=2).delete()
    problems, _ = verify_admin_chain()
    assert len(problems) == 2
    assert "#3" in problems[0] and "sequence gap, expected #2" in problems[0]
    assert "prev_hash does not match" in problems[1]


@pytest.mark.django_db(transaction=True)
def test_two_admins_appending_at_once_keep_one_chain(tenant: Tenant, admin_user: User) -> None:
    barrier = threading.Barrier(2)

    def append(n: int) -> None:
        try:
            barrier.wait()
            for m in range(5):
                with transaction.atomic():
                    admin_event_append(
                        tenant=tenant,
                        event_type="api_key.revoked",
                        subject=f"api_key:key_{n}_{m}",
                        payload={"name": f"bot {n} {m}"},
                        by=admin_user,
                    )
        finally:
            connection.close()

    threads = [threading.Thread(target=append, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert verify_admin_chain() == ([], 10)
    assert sorted(AdminEvent.objects.values_list("seq", flat=True)) == list(range(1, 11))


def test_a_run_event_and_an_admin_event_keep_their_own_chains(
    changes: dict, run: Run, tenant: Tenant
) -> None:
    """Admin events are not in any run's chain: a run's events still start at GENESIS."""
    first = run.events.order_by("seq").first()
    assert first.prev_hash == GENESIS_HASH
    call_command("verify_event_chain")
