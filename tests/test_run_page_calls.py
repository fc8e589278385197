"""A run page shows its calls a page at a time (the latest first), with links to the others;
every call stays one click away from the progress lists and the timeline."""

from __future__ import annotations

import re

import pytest

from console import run_rows
from runs.models import Run, User
from tests.helpers import logged_in, propose_in
from tests.sandbox_process import Sandbox
from toolcalls.models import ToolCall


@pytest.fixture
def calls(run: Run, monkeypatch: pytest.MonkeyPatch, sandbox: Sandbox) -> list[ToolCall]:
    """Five calls, on pages of two: [1, 2], [3, 4], [5]."""
    monkeypatch.setattr(run_rows, "CALLS_PER_PAGE", 2)
    return [propose_in(run, email(n), capability=EMAIL, intent=f"call-{n}") for n in range(5)]


EMAIL = "send-email-v1"


def email(n: int) -> dict[str, str]:
    return {
        "order_id": "order-002",
        "to": "customer-002@example.com",
        "subject": "Your order",
        "body": f"Notice {n}.",
    }


def rows(content: str) -> list[str]:
    return re.findall(r'<tr id="(tc_[^"]+)">', content)


def test_it_shows_the_latest_calls_and_links_to_the_earlier(
    run: Run, calls: list[ToolCall], viewer: User
) -> None:
    content = logged_in(viewer).get(f"/runs/{run.pk}/").content.decode()
    assert rows(content) == [calls[4].pk]
    assert "Showing calls 5 to 5 of 5." in content
    assert 'href="?calls=2#tool-calls">Earlier calls' in content
    assert "Later calls" not in content


def test_an_earlier_page_links_both_ways(run: Run, calls: list[ToolCall], viewer: User) -> None:
    content = logged_in(viewer).get(f"/runs/{run.pk}/", {"calls": 2}).content.decode()
    assert rows(content) == [calls[2].pk, calls[3].pk]
    assert "Showing calls 3 to 4 of 5." in content
    assert 'href="?calls=1#tool-calls">Earlier calls' in content
    assert 'href="?calls=3#tool-calls">Later calls' in content


def test_every_call_is_linked_on_the_page_that_holds_it(
    run: Run, calls: list[ToolCall], viewer: User
) -> None:
    content = logged_in(viewer).get(f"/runs/{run.pk}/", {"calls": 1}).content.decode()
    # Open calls in the progress list: those shown link to their row, the others to their page.
    assert f'href="#{calls[0].pk}"' in content
    assert f'href="?calls=2#{calls[3].pk}"' in content
    assert f'href="?calls=3#{calls[4].pk}"' in content


def test_a_page_it_cannot_read_shows_the_latest(
    run: Run, calls: list[ToolCall], viewer: User
) -> None:
    for page in ("x", "0", "4", "-1"):
        content = logged_in(viewer).get(f"/runs/{run.pk}/", {"calls": page}).content.decode()
        assert rows(content) == [calls[4].pk]


def test_the_poll_keeps_the_chosen_page_and_follows_the_latest_otherwise(
    run: Run, calls: list[ToolCall], viewer: User
) -> None:
    client = logged_in(viewer)
    assert '"calls": "1"' in client.get(f"/runs/{run.pk}/", {"calls": 1}).content.decode()
    assert '"calls"' not in client.get(f"/runs/{run.pk}/").content.decode()


def test_a_short_run_shows_every_call_without_links(
    run: Run, viewer: User, sandbox: Sandbox
) -> None:
    call = propose_in(run, email(0), capability=EMAIL, intent="only")
    content = logged_in(viewer).get(f"/runs/{run.pk}/").content.decode()
    assert rows(content) == [call.pk]
    assert "Showing calls" not in content
