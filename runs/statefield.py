"""django-fsm's `FSMField`, with its state read from the row's `__dict__` when it is there.

django-fsm reads a state through `DeferredAttribute(field).__get__(instance)`: a new
descriptor object and two calls for every read, and a dispatched call reads its two states
about 46 times (9,200 `get_state` per 200 calls, profile_dispatch --profile: each
transition's `can_proceed`, `change_state`, `agent_status` before and after). A loaded state
is in `__dict__` under its attname, where that path finds it too; a deferred one (not in
`__dict__`) still takes django-fsm's path, which loads it. Writes, transitions and the
`protected` rule are django-fsm's own.

Migrations name the field `django_fsm.FSMField` (`deconstruct`): the column is the same, and
no migration is needed for the change. tests/test_runs_statefield.py compares the reads with
django-fsm's.
"""

from __future__ import annotations

from typing import Any

from django_fsm import FSMField, FSMFieldDescriptor


class StateDescriptor(FSMFieldDescriptor):
    def __get__(self, instance: Any, type: Any = None) -> Any:
        if instance is None:
            return self
        try:
            return instance.__dict__[self.field.attname]
        except KeyError:  # deferred: django-fsm loads it
            return self.field.get_state(instance)


class StateField(FSMField):
    descriptor_class = StateDescriptor

    def get_state(self, instance: Any) -> Any:
        try:
            return instance.__dict__[self.attname]
        except KeyError:
            return super().get_state(instance)

    def deconstruct(self) -> tuple[str, str, Any, dict[str, Any]]:
        name, _, args, kwargs = super().deconstruct()
        return name, "django_fsm.FSMField", args, kwargs
