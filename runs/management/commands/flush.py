"""`flush`, able to empty the append-only event log where settings allow it (tests only).

The trigger of migration 0002 refuses TRUNCATE of runs_event unless the transaction has set
`countersign.allow_event_rewrite`. Test teardown flushes every table, so test settings turn
on EVENT_LOG_ALLOW_FLUSH; in production a flush still fails at the database.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.commands import flush
from django.db import connections, transaction


class Command(flush.Command):
    def handle(self, **options: object) -> None:
        database = options["database"]
        connection = connections[database]
        if not (settings.EVENT_LOG_ALLOW_FLUSH and connection.vendor == "postgresql"):
            return super().handle(**options)
        # SET LOCAL lasts until this outer transaction ends; flush's own atomic block nests.
        with transaction.atomic(using=database):
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL countersign.allow_event_rewrite = 'on'")
            return super().handle(**options)
