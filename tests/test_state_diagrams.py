"""docs/state-machines.md is drawn from the transitions, and fails CI when they part ways."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django_fsm import transition

from console import statediagrams
from toolcalls.models import Execution as E
from toolcalls.models import ToolCall


def execution_machine() -> statediagrams.Machine:
    return next(m for m in statediagrams.MACHINES if m.label.endswith(".execution_status"))


@pytest.fixture
def teleport(monkeypatch: pytest.MonkeyPatch) -> None:
    """A transition that exists in no model, added to ToolCall's execution machine."""
    field = execution_machine().field

    @transition(field=field, source=E.COMPENSATED, target=E.PROPOSED)
    def teleport(self: ToolCall) -> None:
        pass

    monkeypatch.setitem(field.transitions[ToolCall], "teleport", teleport)


def test_the_committed_page_matches_the_transitions() -> None:
    committed = statediagrams.PAGE_PATH.read_text() if statediagrams.PAGE_PATH.exists() else ""
    assert committed == statediagrams.render_page(), (
        "docs/state-machines.md differs from the transitions in the models: "
        "run `python manage.py state_diagrams --write` and commit it."
    )


def test_the_execution_diagram_draws_each_transition_as_an_edge() -> None:
    diagram = statediagrams.render_machine(execution_machine())
    assert "    result_unknown --> authorized : authorize\n" in diagram
    assert "    dispatching --> result_unknown : mark_unknown\n" in diagram
    assert "    [*] --> proposed\n" in diagram
    assert "    compensated --> [*]\n" in diagram


def test_a_transition_added_to_a_model_changes_the_page(teleport: None) -> None:
    page = statediagrams.render_page()
    assert "    compensated --> proposed : teleport\n" in page
    # compensated has a way out now.
    assert "    compensated --> [*]\n" not in page
    assert page != statediagrams.PAGE_PATH.read_text()


def test_rendering_twice_gives_the_same_page() -> None:
    assert statediagrams.render_page() == statediagrams.render_page()


def test_check_passes_on_a_current_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(statediagrams, "PAGE_PATH", tmp_path / "state-machines.md")
    call_command("state_diagrams", "--write")
    call_command("state_diagrams", "--check")
    assert "matches the transitions" in capsys.readouterr().out


def test_check_fails_and_says_to_write_when_the_page_is_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, teleport: None
) -> None:
    page = tmp_path / "state-machines.md"
    page.write_text(statediagrams.PAGE_PATH.read_text())
    monkeypatch.setattr(statediagrams, "PAGE_PATH", page)
    with pytest.raises(CommandError, match=r"state_diagrams --write"):
        call_command("state_diagrams", "--check")


def test_the_command_prints_the_page(capsys: pytest.CaptureFixture[str]) -> None:
    call_command("state_diagrams")
    assert capsys.readouterr().out == statediagrams.render_page()
