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
        if names is None:
            self._remember_all()
            return
        names = set(names)
        self._remember(
            f for f in self._meta.concrete_fields if f.name in names or f.attname in names
        )

    @classmethod
    def from_db(cls, db: str | None, field_names: Any, values: Any) -> Any:
        obj = super().from_db(db, field_names, values)
        if len(values) == len(cls._meta.concrete_fields):
            obj._remember_all()
        else:  # deferred fields are not in __dict__: nothing to remember of them
            obj._remember_all(tuple(field_names))
        return obj

    def _remember(self, fields: Any) -> None:
        saved = self.__dict__.setdefault("_saved_values", {})
        for field in fields:
            saved[field.attname] = _snapshot_value(field, self.__dict__.get(field.attname))

    def _remember_all(self, loaded: tuple[str, ...] | None = None) -> None:
        """`_remember` of every concrete field, or of the `loaded` ones (the attnames a
        deferring query read), for a whole row: what a row read or written whole costs (three
        rows per dispatched call are read, per stage; the per-field loop was 4-7 % of a
        worker's CPU, and a third of the desk's, whose 200 rows a page are read deferred)."""
        names, json_names = _names(type(self), loaded)
        values = self.__dict__
        saved = dict(zip(names, map(values.get, names), strict=True))
        for name in json_names:
            saved[name] = repr(saved[name])
        values["_saved_values"] = saved

    def changed_fields(self) -> list[str] | None:
        """The names of the columns changed since the row was read or saved; None for a row
        never read nor saved (save it whole)."""
        saved = self.__dict__.get("_saved_values")
        if not saved:
            return None
        values = self.__dict__
        changed = []
        for name, attname, is_json, always in _comparisons(type(self)):
            if attname not in saved:
                continue
            try:
                value = values[attname]  # not `.get`: a call per column, 27 per save
            except KeyError:
                value = None
            if always or (repr(value) if is_json else value) != saved[attname]:
                changed.append(name)
        return changed


_NAMES: dict[Any, tuple[list[str], list[str]]] = {}
_COMPARISONS: dict[Any, list[tuple[str, str, bool, bool]]] = {}


def _names(model: Any, loaded: tuple[str, ...] | None = None) -> tuple[list[str], list[str]]:
    """The model's concrete fields' attnames (those in `loaded`, when given), and those of its
    JSON fields (kept as repr). A query's deferred fields are the same for each of its rows:
    found once per model and set of columns read."""
    key = model if loaded is None else (model, loaded)
    found = _NAMES.get(key)
    if found is None:
        fields = [f for f in model._meta.concrete_fields if loaded is None or f.attname in loaded]
        found = _NAMES[key] = (
            [f.attname for f in fields],
            [f.attname for f in fields if isinstance(f, models.JSONField)],
        )
    return found


def _comparisons(model: Any) -> list[tuple[str, str, bool, bool]]:
    """(name, attname, is JSON, auto_now) of the fields changed_fields compares: all but the
    primary key, in the model's order."""
    found = _COMPARISONS.get(model)
    if found is None:
        found = _COMPARISONS[model] = [
            (
                f.name,
                f.attname,
                isinstance(f, models.JSONField),
                bool(getattr(f, "auto_now", False)),
            )
            for f in model._meta.concrete_fields
            if not f.primary_key
        ]
    return found
