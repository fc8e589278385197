"""The console's sessions (runs/sessions.py) read Django's rows as Django's own store does:
the data of a live key, nothing for an expired or unknown one (whose key is then dropped)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.sessions.backends.db import SessionStore as DjangoStore
from django.contrib.sessions.models import Session
from django.utils import timezone

from runs.sessions import SessionStore

pytestmark = pytest.mark.django_db


def _saved(data: dict) -> str:
    store = DjangoStore()
    store.update(data)
    store.save()
    return store.session_key


def test_it_loads_what_djangos_store_saved() -> None:
    key = _saved({"_auth_user_id": "7", "n": [1, 2]})

    ours, theirs = SessionStore(key), DjangoStore(key)

    assert ours.load() == theirs.load() == {"_auth_user_id": "7", "n": [1, 2]}
    assert ours.session_key == key


@pytest.mark.parametrize("expired", [True, False])
def test_an_expired_or_unknown_key_loads_nothing_and_is_dropped(expired: bool) -> None:
    key = _saved({"n": 1})
    if expired:
        Session.objects.filter(pk=key).update(expire_date=timezone.now() - timedelta(seconds=1))
    else:
        key = key[:-4] + "zzzz"

    ours, theirs = SessionStore(key), DjangoStore(key)

    assert ours.load() == theirs.load() == {}
    assert ours.session_key is None and theirs.session_key is None


def test_a_session_it_loaded_saves_as_djangos() -> None:
    key = _saved({"n": 1})
    store = SessionStore(key)
    store["n"] = 2
    store.save()

    assert DjangoStore(key).load() == {"n": 2}
