from __future__ import annotations

import json
from collections.abc import Iterator

from django.core.management.base import BaseCommand, CommandError
from django.db.models import TextField
from django.db.models.functions import Cast

from runs.events import UnreadablePayload, verify_chain
from runs.models import Event


def events_in_order() -> Iterator[Event]:
    """Every event by run and sequence. Payloads are loaded here, one by one, rather than by
    the database driver for a whole chunk: a payload that cannot be loaded (an integer of
    more digits than Python converts) is then one problem, not the end of the check."""
    rows = (
        Event.objects.defer("payload")
        .annotate(payload_text=Cast("payload", output_field=TextField()))
        .order_by("run_id", "seq")
    )
    for event in rows.iterator(chunk_size=2000):
        try:
            event.payload = json.loads(event.payload_text)
        except ValueError as exc:
            event.payload = UnreadablePayload(exc)
        yield event


class Command(BaseCommand):
    help = "Check every event's hash and its link to the previous event of its run."

    def handle(self, *args: object, **options: object) -> None:
        problems = verify_chain(events_in_order())
        for line in problems:
            self.stdout.write(line)
        count = Event.objects.count()
        if problems:
            raise CommandError(f"{len(problems)} problems in {count} events.")
        self.stdout.write(f"OK: {count} events, every hash and link checks out.")
