"""Who an event's actor is, without its kind: "user:alice", "api_key:key_…" and
"system:sweeper" name the people "ALICE", "KEY_…" and "SWEEPER" (the audit's person filter)."""

from __future__ import annotations

from django.db import models
from django.db.models import Func
from django.db.models.functions import Upper

# What an actor names before its colon (Event.actor).
ACTOR_KINDS = ("USER", "API_KEY", "SYSTEM")


class ActorPerson(Func):
    """The actor uppercased, less its kind, in SQL: the event_person index is on it, so a
    person's events are one value of it, read newest first in the index's order.

    Its constants are written into the SQL, not sent as parameters: a statement psycopg has
    prepared may get a generic plan, and only the same text as the index's expression (not
    `substr(…, $2, $3) = $4`) lets that plan use the index. `substr` and CASE, not
    regexp_replace, so that SQLite (the demo's database) builds the index too."""

    template = (
        "CASE "
        + " ".join(
            f"WHEN substr({{actor}}, 1, {len(kind) + 1}) = '{kind}:' "
            f"THEN substr({{actor}}, {len(kind) + 2})"
            for kind in ACTOR_KINDS
        )
        + " ELSE {actor} END"
    )
    output_field = models.CharField()

    def __init__(self, field: str = "actor") -> None:
        super().__init__(Upper(field))

    def as_sql(self, compiler, connection, **extra):
        actor, params = compiler.compile(self.source_expressions[0])
        uses = self.template.count("{actor}")
        return self.template.format(actor=actor), tuple(params) * uses


def person_of(actor: str) -> str:
    """What `ActorPerson` gives for `actor`."""
    upper = actor.upper()
    for kind in ACTOR_KINDS:
        if upper.startswith(f"{kind}:"):
            return upper[len(kind) + 1 :]
    return upper
