"""`field__any=ids`: a column equal to one of many values, as one array parameter.

`__in` writes a placeholder per value: `rebuild_projections --verify` reads each batch's
stored rows by a few thousand run ids in 13 statements, and building those filters (the
ORM preparing each id, psycopg splitting a query of thousands of placeholders) was a third
of its comparing (cProfile over `projections.verify()` at a million events). On PostgreSQL
`= ANY(%s)` sends the ids as one text[] parameter; elsewhere (SQLite, the demo) it is
`IN (…)` as before.
"""

from __future__ import annotations

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
