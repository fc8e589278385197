"""The memory app's written-out reads: the feedback lists of the run page and the approval
page, read on each of those pages. Compiling the ORM's query cost more than running it
(bench_pages --profile "run page"); tests/test_feedback_sql.py proves the rows equal the
ORM's (memory/feedback.py run_feedback_orm, approval_feedback_orm)."""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, connection, connections

from memory.models import Feedback
from runs import dbvalues

_COLUMNS = ", ".join(f'"{field.column}"' for field in Feedback._meta.concrete_fields)
_FEEDBACK = (
    f'SELECT {_COLUMNS} FROM "{Feedback._meta.db_table}" WHERE run_id = %s{{subject}} ORDER BY id'
)
_OF_RUN = _FEEDBACK.format(subject="")
_OF_SUBJECT = _FEEDBACK.format(subject=" AND subject_kind = %s AND subject_id = %s")


def feedback(run_id: str, subject: tuple[str, str] | None = None) -> list[Feedback]:
    """The run's feedback (about `subject`, a (kind, id), when given), oldest first."""
    with connection.cursor() as cursor:
        if subject is None:
            cursor.execute(_OF_RUN, [run_id])
        else:
            cursor.execute(_OF_SUBJECT, [run_id, *subject])
        rows = cursor.fetchall()
    conn = connections[DEFAULT_DB_ALIAS]
    return [dbvalues.from_row(Feedback, conn, row) for row in rows]
