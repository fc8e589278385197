"""The backend that signs people in to the console: Django's, reading the person with their
tenant.

Every console page names the person's tenant (the request's log context, each view's
filters, the top bar): with the tenant joined to the person's row it is one query per
request fewer, on every page (one hand-written statement: runs/sql.py, person_read). A
session signed in through Django's own ModelBackend (before this backend) must sign in once
again.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.backends import ModelBackend

from runs import sql
from runs.models import User


class PersonBackend(ModelBackend):
    def get_user(self, user_id: Any) -> User | None:
        # Written out (runs/sql.py): the ORM's compilation of this read was most of its cost.
        user = sql.person_read(user_id)
        return user if user is not None and self.user_can_authenticate(user) else None
