"""PostgreSQL session limits on web and worker connections (issue #10, 5: settings).

A process that stalls inside a transaction must not hold its row locks for long: every
connection carries lock_timeout, idle_in_transaction_session_timeout and statement_timeout,
each set by an environment variable; a request that runs out of lock time gets a named 503.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psycopg
import pytest
from django.db import connection

from runs.models import Decision, Event
from tests.conftest import ApiClient
from tests.helpers import ROOT

LIMITS = ("lock_timeout", "idle_in_transaction_session_timeout", "statement_timeout")


def show(cursor, name: str) -> str:
    cursor.execute(f"SHOW {name}")
    return cursor.fetchone()[0]


def limits_in_a_process(settings_module: str, **env: str) -> subprocess.CompletedProcess:
    """SHOW each limit on a connection of a fresh process, as a web or worker process opens it."""
    db = connection.settings_dict
    script = (
        "import django; django.setup()\n"
        "from django.db import connection\n"
        "with connection.cursor() as cursor:\n"
        f"    for name in {LIMITS!r}:\n"
        "        cursor.execute('SHOW ' + name); print(name, cursor.fetchone()[0])\n"
    )
    environ = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": settings_module,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        **env,
    }
    for name in (
        "DATABASE_LOCK_TIMEOUT",
        "DATABASE_IDLE_IN_TRANSACTION_TIMEOUT",
        "DATABASE_STATEMENT_TIMEOUT",
    ):
        if name not in env:
            environ.pop(name, None)
    return subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=environ, capture_output=True, text=True
    )


def shown(result: subprocess.CompletedProcess) -> dict[str, str]:
    assert result.returncode == 0, result.stderr[-2000:]
    return dict(line.split(" ", 1) for line in result.stdout.splitlines())


@pytest.mark.django_db
def test_the_test_connection_carries_the_lock_and_statement_timeouts() -> None:
    with connection.cursor() as cursor:
        assert show(cursor, "lock_timeout") == "5s"
        assert show(cursor, "statement_timeout") == "30s"
        # Off in the test process only: pytest-django's transaction around a `db` test sits
        # idle while the test waits on anything else (config/settings/test.py).
        assert show(cursor, "idle_in_transaction_session_timeout") == "0"


@pytest.mark.django_db
@pytest.mark.parametrize("settings_module", ["config.settings.base", "config.settings.production"])
def test_a_web_or_worker_process_carries_all_three(settings_module: str) -> None:
    assert shown(limits_in_a_process(settings_module)) == {
        "lock_timeout": "5s",
        "idle_in_transaction_session_timeout": "10s",
        "statement_timeout": "30s",
    }


@pytest.mark.django_db
def test_each_limit_is_set_by_its_environment_variable() -> None:
    result = limits_in_a_process(
        "config.settings.base",
        DATABASE_LOCK_TIMEOUT="1500ms",
        DATABASE_IDLE_IN_TRANSACTION_TIMEOUT="1min",
        DATABASE_STATEMENT_TIMEOUT="0",
    )
    assert shown(result) == {
        "lock_timeout": "1500ms",
        "idle_in_transaction_session_timeout": "1min",
        "statement_timeout": "0",
    }


@pytest.mark.django_db
def test_an_empty_value_leaves_the_limit_to_the_server() -> None:
    result = limits_in_a_process("config.settings.base", DATABASE_LOCK_TIMEOUT="")
    assert shown(result)["lock_timeout"] == "0"  # the server's default here


@pytest.mark.django_db
def test_a_value_that_is_not_a_duration_stops_the_process() -> None:
    result = limits_in_a_process("config.settings.base", DATABASE_LOCK_TIMEOUT="5s -c x=1")
    assert result.returncode != 0
    assert "lock_timeout must be a PostgreSQL duration" in result.stderr


@pytest.mark.django_db(transaction=True)
def test_a_request_that_waits_too_long_for_a_lock_gets_a_named_503(agent: ApiClient) -> None:
    run_id = agent.post("/api/v1/runs", {"title": "t"}).json()["run_id"]
    db = connection.settings_dict
    # Another session holds the run's row lock, as a worker stopped inside its claim would.
    holder = psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"])
    try:
        holder.execute("SELECT id FROM runs_run WHERE id = %s FOR UPDATE", [run_id])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '500ms'")  # the configured 5s, shortened
        started = time.monotonic()
        response = agent.post(f"/api/v1/runs/{run_id}/decisions", {"kind": "k", "content": {}})
        elapsed = time.monotonic() - started
    finally:
        holder.close()
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert response.status_code == 503, response.content[:300]
    assert response.json()["error"]["name"] == "database.busy"
    assert response["Retry-After"] == "1"
    assert elapsed < 3
    assert not Decision.objects.exists()
    assert Event.objects.count() == 1  # run.started only
    # The connection is fine afterwards: the same request now goes through.
    response = agent.post(f"/api/v1/runs/{run_id}/decisions", {"kind": "k", "content": {}})
    assert response.status_code == 201, response.json()
