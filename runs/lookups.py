"""`field__any=ids`: a column equal to one of many values, as one array parameter.

`__in` writes a placeholder per value: `rebuild_projections --verify` reads each batch's
stored rows by a few thousand run ids in 13 statements, and building those filters (the
ORM preparing each id, psycopg splitting a query of thousands of placeholders) was a third
of its comparing (cProfile over `projections.verify()` at a million events). On PostgreSQL
`= ANY(%s)` sends the ids as one text[] parameter; elsewhere (SQLite, the demo) it is
`IN (…)` as before.

`id_array` is the same parameter for the hand-written statements (runs/sql.py,
toolcalls/sql.py), written as PostgreSQL's array literal.
"""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db.models import Field, ForeignObject, Lookup


# On a foreign key too (`run_id__any`): its lookups are its own, not inherited from Field's.
@ForeignObject.register_lookup
@Field.register_lookup
class AnyOf(Lookup):
    lookup_name = "any"
    # The values go to the database as they are: strings (run ids) or integers.
    prepare_rhs = False

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        lhs, params = self.process_lhs(compiler, connection)
        values = list(self.rhs)
        if not values:
            raise EmptyResultSet
        return f"{lhs} IN ({', '.join(['%s'] * len(values))})", [*params, *values]

    def as_postgresql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        lhs, params = self.process_lhs(compiler, connection)
        return f"{lhs} = ANY(%s)", [*params, list(self.rhs)]


# Ids as they are made (runs/ids.py: a prefix, "_", Crockford base32) and the run ids and
# outbox ids of other makers: letters, digits, "_" and "-", never empty, never "NULL".
_BARE = re.compile(r"[0-9A-Za-z_-]+(?:,[0-9A-Za-z_-]+)*")
_NULL = re.compile(r"(?:^|,)null(?:,|$)", re.IGNORECASE)


def id_array(ids: Any) -> str | list[str]:
    """A list of ids as PostgreSQL's array literal (`{a,b}`), for a `%s::varchar[]`
    parameter: psycopg's list dumper is Python and goes element by element (~2 calls each and
    ~17 a list; a dispatch batch sends a dozen lists). A list with any other id (a comma, a
    quote, a space, an empty one, "NULL"), which the literal would have to quote, goes to
    psycopg as the list it is."""
    ids = list(ids)
    try:
        joined = ",".join(ids)
    except TypeError:  # not strings: psycopg's dumper knows their types
        return ids
    bare = _BARE.fullmatch(joined) and joined.count(",") == len(ids) - 1  # no comma in one
    if not ids or (bare and not _NULL.search(joined)):
        return "{" + joined + "}"
    return ids
