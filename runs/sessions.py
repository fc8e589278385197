"""The console's sessions: Django's database sessions, in a table whose rows also name the
signed-in person (runs.models.Session), read with one written-out SELECT that loads the person
with their tenant as well.

Every console request reads its session, then its person (runs/backends.py): two statements,
two round trips on the approver's clock, each a wait for a core on a busy host (issue 12,
`bench_approve --load dispatch`). The row's `user_id` is written from the session's data at
every save, so the join names whom the data names. What the person's read then decides is
Django's: `django.contrib.auth.get_user` still checks the backend, the person's session hash
(a changed password signs them out) and whether they may sign in (runs/backends.py). An
expired or unknown key loads nothing and is dropped, as Django's store does
(tests/test_sessions.py). Settings: SESSION_ENGINE = "runs.sessions".
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import SESSION_KEY
from django.contrib.sessions.backends import db
from django.core.exceptions import ValidationError
from django.db import connections, router
from django.utils import timezone

# The person a session's read loaded: not read (another database than PostgreSQL, or no read
# yet), or the read's answer (None: the row names no one who still exists).
NOT_READ = object()

_READ = "SELECT session_data, expire_date FROM {table} WHERE session_key = %s AND expire_date > %s"


class SessionStore(db.SessionStore):
    def __init__(self, session_key: str | None = None) -> None:
        super().__init__(session_key)
        self._person: Any = NOT_READ
        self._person_id: Any = None

    @classmethod
    def get_model_class(cls) -> type:
        from runs.models import Session

        return Session

    def create_model_instance(self, data: dict[str, Any]) -> Any:
        session = super().create_model_instance(data)
        session.user_id = self._named(data)
        return session

    async def acreate_model_instance(self, data: dict[str, Any]) -> Any:
        session = await super().acreate_model_instance(data)
        session.user_id = self._named(data)
        return session

    def _named(self, data: dict[str, Any]) -> Any:
        """The id of the person the data names, for the row; None when it names no one (or
        nothing a person's id can be: Django's `get_user` refuses that value too)."""
        try:
            return self.model.user.field.to_python(data.get(SESSION_KEY))
        except ValidationError:
            return None

    def person(self, user_id: Any) -> Any:
        """The person `user_id` as this session's read loaded them, or NOT_READ when the read
        did not load them (another id than the row's, or no joined read)."""
        if self._person is NOT_READ or str(self._person_id) != str(user_id):
            return NOT_READ
        return self._person

    def _get_session_from_db(self) -> Any:
        # Only what this read loads may be taken: not a person an earlier read of the store did.
        self._person, self._person_id = NOT_READ, None
        model = self.model
        conn = connections[router.db_for_read(model)]
        if conn.vendor == "postgresql":
            from runs import sql

            read = sql.session_read(self.session_key, timezone.now())
            if read is not None:
                session, self._person = read
                self._person_id = session.user_id
                return session
        else:
            with conn.cursor() as cursor:
                cursor.execute(
                    _READ.format(table=model._meta.db_table), [self.session_key, timezone.now()]
                )
                row = cursor.fetchone()
            if row is not None:
                return model(session_key=self.session_key, session_data=row[0], expire_date=row[1])
        # As Django's: an unknown or expired key is dropped; a new one is made on save.
        self._session_key = None
        return None
