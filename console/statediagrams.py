"""The state machines drawn from their transitions: one Mermaid `stateDiagram-v2` per machine.

The edges are read from the models' `@transition` methods the way django-fsm-2's own
`graph_transitions` reads them (`FSMField.get_all_transitions`), so the page cannot say
anything the code does not do. Everything is sorted: the same code always renders the same
page, and `tests/test_state_diagrams.py` compares it with the committed one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import django_fsm as fsm
from django.conf import settings
from django.db import models

from approvals.models import Approval
from runs.models import Run
from toolcalls.models import ToolCall

PAGE_PATH = Path(settings.BASE_DIR) / "docs" / "state-machines.md"
COMMAND = "python manage.py state_diagrams --write"

INTRO = f"""\
# State machines

Generated from the `@transition` methods of the models by
`{COMMAND}`: do not edit it by hand.
`tests/test_state_diagrams.py` fails when this page and the transitions differ
(`python manage.py state_diagrams --check` says the same). The prose version, with what each
state means, is section 4 of the design document ("State machines"). Every edge is one
transition method, named on the edge; a transition with several sources is one edge per
source. `[*] -->` marks the state a new row starts in, `--> [*]` a state with no way out.
"""


@dataclass(frozen=True)
class Machine:
    title: str
    model: type[models.Model]
    field_name: str
    meaning: str

    @property
    def field(self) -> fsm.FSMFieldMixin:
        field = self.model._meta.get_field(self.field_name)
        assert isinstance(field, fsm.FSMFieldMixin)
        return field

    @property
    def label(self) -> str:
        return f"{self.model._meta.label}.{self.field_name}"


MACHINES = [
    Machine(
        "Run",
        Run,
        "state",
        "The run is the agent's task as a whole: it waits while an approval is pending, ends "
        "with one of the exit types or is cancelled, and resumes from `needs_human` once none "
        "of its outcomes is unknown.",
    ),
    Machine(
        "Tool call: execution",
        ToolCall,
        "execution_status",
        "Execution is what happened to our command: allowed, sent, acknowledged, finished; "
        "`result_unknown` means it may have left and its answer was lost.",
    ),
    Machine(
        "Tool call: verification",
        ToolCall,
        "verification_status",
        "Verification is what we observed of domain reality (the refund on the order, the "
        "waybill's address), apart from our command's answer: it can lag it, disagree with it "
        "(`inconclusive`) or be all that is left when the answer was lost.",
    ),
    Machine(
        "Approval",
        Approval,
        "state",
        "An approval lets one tool call run with one argument digest on one object revision, "
        "once: `consumed` by the dispatch it authorizes; every other end means it cannot be used.",
    ),
]


def states(machine: Machine) -> list[str]:
    return sorted(str(value) for value, _label in machine.field.choices)


def edges(machine: Machine) -> list[tuple[str, str, str]]:
    """(source, target, method name) for every transition, with `*` and `+` expanded."""
    everything = states(machine)
    found = set()
    for transition in machine.field.get_all_transitions(machine.model):
        if isinstance(transition.target, fsm.GET_STATE | fsm.RETURN_VALUE):
            targets = [str(state) for state in transition.target.allowed_states]
        elif transition.target is None:
            targets = []  # Stays where it is: a self-loop from each source, added below.
        else:
            targets = [str(transition.target)]
        if transition.source == fsm.ANY_STATE:
            sources = everything
        elif transition.source == fsm.ANY_OTHER_STATE:
            sources = [state for state in everything if state not in targets]
        else:
            sources = [str(transition.source)]
        for source in sources:
            for target in targets or [source]:
                found.add((source, target, transition.name))
            if transition.on_error:
                found.add((source, str(transition.on_error), f"{transition.name} (on error)"))
    return sorted(found)


def render_machine(machine: Machine) -> str:
    machine_edges = edges(machine)
    named = states(machine)
    seen = sorted(set(named) | {s for edge in machine_edges for s in edge[:2]})
    leaving = {source for source, _target, _name in machine_edges}
    lines = [
        f"## {machine.title} (`{machine.label}`)",
        "",
        "```mermaid",
        "stateDiagram-v2",
        *(f"    {state}" for state in seen),
        f"    [*] --> {machine.field.default!s}",
        *(f"    {source} --> {target} : {name}" for source, target, name in machine_edges),
        *(f"    {state} --> [*]" for state in seen if state not in leaving),
        "```",
        "",
        machine.meaning,
    ]
    return "\n".join(lines) + "\n"


def render_page() -> str:
    return "\n".join([INTRO, *(render_machine(machine) for machine in MACHINES)])
