"""Rows that save only the columns that changed.

A transition changes two or three columns of a tool call of twenty-seven; writing them all
cost about three times the UPDATE of the changed ones (bench_dispatch). A model with this
mixin remembers the values it was read or last saved with, and `changed_fields` names the
columns that differ since (`updated_at`-style auto_now columns always count).
`transitions.apply` saves just those.
"""

from __future__ import annotations

from typing import Any

from django.db import models


def _snapshot_value(field: models.Field, value: Any) -> Any:
    # A JSON value may be changed in place (call.result["x"] = …), so the value read is no
    # record of it: keep its repr, which Python builds in C. A deep copy of each one was a
    # third of the desk item's CPU (bench_pages --profile: it reads every call of the run).
    # Equal reprs of JSON values mean equal values; the reverse can fail (keys reordered,
    # 1 vs 1.0), which only saves a column that did not change.
    return repr(value) if isinstance(field, models.JSONField) else value


class SavesChangedFields(models.Model):
    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        super().save(*args, **kwargs)
        names = kwargs.get("update_fields")
        fields = self._meta.concrete_fields
        if names is not None:
            names = set(names)
            fields = [f for f in fields if f.name in names or f.attname in names]
        self._remember(fields)

    @classmethod
    def from_db(cls, db: str | None, field_names: Any, values: Any) -> Any:
        obj = super().from_db(db, field_names, values)
        obj._remember(f for f in cls._meta.concrete_fields if f.attname in obj.__dict__)
        return obj

    def _remember(self, fields: Any) -> None:
        saved = self.__dict__.setdefault("_saved_values", {})
        for field in fields:
            saved[field.attname] = _snapshot_value(field, self.__dict__.get(field.attname))

    def changed_fields(self) -> list[str] | None:
        """The names of the columns changed since the row was read or saved; None for a row
        never read nor saved (save it whole)."""
        saved = self.__dict__.get("_saved_values")
        if not saved:
            return None
        changed = []
        for field in self._meta.concrete_fields:
            if field.primary_key or field.attname not in saved:
                continue
            if (
                getattr(field, "auto_now", False)
                or _snapshot_value(field, self.__dict__.get(field.attname)) != saved[field.attname]
            ):
                changed.append(field.name)
        return changed
