from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from runs.events import verify_chain
from runs.models import Event


class Command(BaseCommand):
    help = "Check every event's hash and its link to the previous event of its run."

    def handle(self, *args: object, **options: object) -> None:
        events = Event.objects.order_by("run_id", "seq").iterator(chunk_size=2000)
        problems = verify_chain(events)
        for line in problems:
            self.stdout.write(line)
        count = Event.objects.count()
        if problems:
            raise CommandError(f"{len(problems)} problems in {count} events.")
        self.stdout.write(f"OK: {count} events, every hash and link checks out.")
