from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from runs.admin_events import verify_admin_chain
from runs.chain_check import verify_log


class Command(BaseCommand):
    help = (
        "Check every event's hash and its link to the previous event of its run, streaming "
        "the log in (run, seq) order in constant memory (runs/chain_check.py); then the admin "
        "events' chain of each tenant the same way (runs/admin_events.py)."
    )

    def handle(self, *args: object, **options: object) -> None:
        problems, count = verify_log()
        admin_problems, admin_count = verify_admin_chain()
        problems += admin_problems
        for line in problems:
            self.stdout.write(line)
        admin = f" and {admin_count} admin events" if admin_count else ""
        if problems:
            raise CommandError(f"{len(problems)} problems in {count} events{admin}.")
        self.stdout.write(f"OK: {count} events{admin}, every hash and link checks out.")
