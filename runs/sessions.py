"""Django's database sessions, read with one written-out SELECT.

Every console request reads its session before anything else; compiling the ORM query for
it cost more CPU than running it (bench_pages --profile, the 204 polls). The row, the table
and what an expired or unknown key does are Django's (tests/test_sessions.py); only the
read is written out. Settings: SESSION_ENGINE = "runs.sessions".
"""

from __future__ import annotations

from typing import Any

from django.contrib.sessions.backends import db
from django.db import connections, router
from django.utils import timezone

_READ = "SELECT session_data, expire_date FROM {table} WHERE session_key = %s AND expire_date > %s"


class SessionStore(db.SessionStore):
    def _get_session_from_db(self) -> Any:
        model = self.model
        with connections[router.db_for_read(model)].cursor() as cursor:
            cursor.execute(
                _READ.format(table=model._meta.db_table), [self.session_key, timezone.now()]
            )
            row = cursor.fetchone()
        if row is None:
            # As Django's: an unknown or expired key is dropped; a new one is made on save.
            self._session_key = None
            return None
        return model(session_key=self.session_key, session_data=row[0], expire_date=row[1])
