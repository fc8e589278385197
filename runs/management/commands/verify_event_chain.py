from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from runs.chain_check import verify_log


class Command(BaseCommand):
    help = (
        "Check every event's hash and its link to the previous event of its run, streaming "
        "the log in (run, seq) order in constant memory (runs/chain_check.py)."
    )

    def handle(self, *args: object, **options: object) -> None:
        problems, count = verify_log()
        for line in problems:
            self.stdout.write(line)
        if problems:
            raise CommandError(f"{len(problems)} problems in {count} events.")
        self.stdout.write(f"OK: {count} events, every hash and link checks out.")
