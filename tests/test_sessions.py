"""The console's sessions (runs/sessions.py): Django's database sessions, whose rows also name
the signed-in person, read with that person and their tenant in one statement. They load and
save as Django's store does (nothing for an expired or unknown key, which is then dropped), and
what decides who is signed in stays Django's: the backend, the session hash, whether the person
may sign in."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.sessions.backends.db import SessionStore as DjangoStore
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs import sql
from runs.models import Session, Tenant, User
from runs.sessions import NOT_READ, SessionStore
from tests.helpers import logged_in

pytestmark = pytest.mark.django_db


def _saved(data: dict) -> str:
    store = SessionStore()
    store.update(data)
    store.save()
    return store.session_key


def _values(obj: Any) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def test_it_loads_what_it_saved_and_decodes_as_djangos_store() -> None:
    key = _saved({"_auth_user_id": "7", "n": [1, 2]})
    row = Session.objects.get(pk=key)

    store = SessionStore(key)
    assert store.load() == {"_auth_user_id": "7", "n": [1, 2]}
    assert DjangoStore().decode(row.session_data) == {"_auth_user_id": "7", "n": [1, 2]}
    assert store.session_key == key
    assert row.user_id == 7  # from the data, at the save


@pytest.mark.parametrize("expired", [True, False])
def test_an_expired_or_unknown_key_loads_nothing_and_is_dropped(expired: bool) -> None:
    key = _saved({"n": 1})
    if expired:
        Session.objects.filter(pk=key).update(expire_date=timezone.now() - timedelta(seconds=1))
    else:
        key = key[:-4] + "zzzz"

    store = SessionStore(key)

    assert store.load() == {}
    assert store.session_key is None and store.person("7") is NOT_READ


def test_a_session_it_loaded_saves_its_changes() -> None:
    key = _saved({"n": 1})
    store = SessionStore(key)
    store["n"] = 2
    store.save()

    assert SessionStore(key).load() == {"n": 2}
    assert Session.objects.get(pk=key).user_id is None


def test_the_person_is_read_with_the_session_as_person_read_reads_them(
    tenant: Tenant, approver: User
) -> None:
    key = logged_in(approver).session.session_key
    assert Session.objects.get(pk=key).user_id == approver.pk

    store = SessionStore(key)
    with CaptureQueriesContext(connection) as queries:
        store.load()
        read = store.person(str(approver.pk))  # as the session's data names them
        slug = read.tenant.slug  # no further query

    alone = sql.person_read(approver.pk)
    assert len(queries) == 1
    assert _values(read) == _values(alone) and _values(read.tenant) == _values(alone.tenant)
    assert slug == tenant.slug
    assert store.person(str(approver.pk + 1)) is NOT_READ  # not whom the row names


def test_a_console_page_reads_session_and_person_in_one_statement(approver: User) -> None:
    client = logged_in(approver)
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/approvals/").status_code == 200

    statements = [q["sql"] for q in queries.captured_queries]
    assert sum(Session._meta.db_table in s for s in statements) == 1
    # Not the person's own read (runs/sql.py person_read) as well.
    assert not [s for s in statements if s.startswith(sql._PERSON.split(" WHERE")[0])]


def test_the_session_hash_still_signs_out_a_person_whose_password_changed(
    approver: User,
) -> None:
    client = logged_in(approver)
    assert client.get("/approvals/").status_code == 200
    approver.set_password("a-new-password-entirely")
    approver.save()
    assert client.get("/approvals/").status_code == 302  # to the login page


def test_a_deleted_person_loses_their_sessions(tenant: Tenant) -> None:
    person = User.objects.create_user(
        username="gone", password="x", tenant=tenant, role=User.Role.APPROVER
    )
    client = logged_in(person)
    key = client.session.session_key
    person.delete()

    assert not Session.objects.filter(pk=key).exists()
    assert client.get("/approvals/").status_code == 302


def test_a_row_naming_someone_who_no_longer_exists_signs_no_one_in(approver: User) -> None:
    client = logged_in(approver)
    Session.objects.filter(pk=client.session.session_key).update(user_id=999_999)
    store = SessionStore(client.session.session_key)
    store.load()
    assert store.person("999999") is None
    # The data still names the approver: the row's mismatch makes the backend read them itself.
    assert store.person(str(approver.pk)) is NOT_READ
    assert client.get("/approvals/").status_code == 200


def test_a_second_read_forgets_what_the_first_loaded(approver: User) -> None:
    key = logged_in(approver).session.session_key
    store = SessionStore(key)
    store.load()
    assert store.person(str(approver.pk)) is not NOT_READ
    Session.objects.filter(pk=key).delete()
    store._session_key = key  # read the same key again: it is gone now
    store.load()
    assert store.person(str(approver.pk)) is NOT_READ


def test_a_deactivated_person_is_signed_out(approver: User) -> None:
    client = logged_in(approver)
    assert client.get("/approvals/").status_code == 200
    User.objects.filter(pk=approver.pk).update(is_active=False)
    assert client.get("/approvals/").status_code == 302


def test_a_value_that_is_no_persons_id_saves_a_row_naming_no_one() -> None:
    key = _saved({"_auth_user_id": "not-a-number"})
    assert Session.objects.get(pk=key).user_id is None


def test_an_async_save_names_the_person_too(approver: User) -> None:
    from asgiref.sync import async_to_sync

    store = SessionStore()
    store["_auth_user_id"] = str(approver.pk)
    async_to_sync(store.asave)()
    assert Session.objects.get(pk=store.session_key).user_id == approver.pk


def test_signing_out_leaves_no_row_naming_the_person(approver: User) -> None:
    client = logged_in(approver)
    client.logout()
    assert not Session.objects.filter(user_id=approver.pk).exists()


def test_another_database_reads_the_session_alone(approver: User, monkeypatch) -> None:
    key = logged_in(approver).session.session_key
    monkeypatch.setattr(connection, "vendor", "sqlite")

    store = SessionStore(key)
    assert store.load()["_auth_user_id"] == str(approver.pk)
    assert store.person(str(approver.pk)) is NOT_READ  # the backend reads the person itself


def test_a_client_without_a_session_is_anonymous(db: None) -> None:
    assert Client().get("/approvals/").status_code == 302


def test_beat_clears_expired_sessions_and_keeps_live_ones(settings) -> None:
    from config.celery_app import app
    from runs.tasks import clear_expired_sessions

    live, old = _saved({"n": 1}), _saved({"n": 2})
    Session.objects.filter(pk=old).update(expire_date=timezone.now() - timedelta(seconds=1))

    schedule = {e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values()}
    assert "runs.clear_expired_sessions" in schedule
    assert "runs.clear_expired_sessions" in app.tasks
    clear_expired_sessions()

    assert list(Session.objects.values_list("pk", flat=True)) == [live]
