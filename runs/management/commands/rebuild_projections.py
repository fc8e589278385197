from __future__ import annotations

import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs import projections
from runs.models import Run


class Command(BaseCommand):
    help = "Replay the event log and compare the rebuilt state with the stored rows."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--verify",
            action="store_true",
            help="report the differences and exit non-zero on any",
        )

    def handle(self, *args: object, **options: object) -> None:
        if not options["verify"]:
            # Overwriting the tables from the log would hide the bug that made them drift.
            raise CommandError("Only --verify is offered: a difference is a bug to fix.")
        started, cpu = time.monotonic(), time.process_time()
        problems, count = projections.verify_log()
        seconds, cpu = time.monotonic() - started, time.process_time() - cpu
        for line in problems:
            self.stdout.write(line)
        names = ", ".join([*projections.PROJECTIONS, *projections.LOG_CHECKS])
        # What an operator needs to plan the check on a large log, whatever it found: its
        # pace and its memory, which does not grow with the log (runs/projections.py
        # compares a batch of events' runs at a time).
        pace = (
            f"{seconds:.1f} s, {count / max(seconds, 1e-9):,.0f} events/s; this process's CPU "
            f"{cpu:.1f} s ({count / max(cpu, 1e-9):,.0f} events per CPU second); "
            f"peak RSS {_peak_rss_mib():.1f} MiB"
        )
        if problems:
            self.stdout.write(pace)
            raise CommandError(f"{len(problems)} differences after replaying {count} events.")
        self.stdout.write(f"OK: replayed {count} events; {names} match the stored rows.")
        self.stdout.write(pace)
        archived = Run.objects.filter(archived_at__isnull=False).count()
        if archived:
            # Their rows are in the *_archive tables; verify_event_chain still checks their log.
            self.stdout.write(f"{archived} archived runs were left out of the comparison.")


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0  # not Linux: no /proc
