from __future__ import annotations

import re
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from memory import archive
from runs.models import Tenant

AGE = re.compile(r"^(\d+)([dh])$")


def parse_age(text: str) -> timedelta:
    match = AGE.match(text)
    if not match:
        raise CommandError(f"--older-than takes days or hours such as 30d or 12h, not {text!r}.")
    number, unit = int(match[1]), match[2]
    return timedelta(days=number) if unit == "d" else timedelta(hours=number)


class Command(BaseCommand):
    help = (
        "Move finished runs' runtime rows (decisions, tool calls, attempts, receipts, "
        "approvals, checkpoints, feedback, run credentials) to the *_archive tables. The run "
        "row and the event log stay; each archived run gets a run.archived event."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            help="runs that ended longer ago than this (30d, 12h); default: each tenant's "
            "archive_after_days",
        )
        parser.add_argument("--tenant", help="only this tenant's runs (its slug)")
        parser.add_argument(
            "--dry-run", action="store_true", help="print what would move, move nothing"
        )

    def handle(self, *args: object, **options: object) -> None:
        if connection.vendor != "postgresql":
            raise CommandError(
                "archive_runs moves rows with PostgreSQL statements: use PostgreSQL."
            )
        older_than = parse_age(options["older_than"]) if options["older_than"] else None
        tenant = None
        if options["tenant"]:
            tenant = Tenant.objects.filter(slug=options["tenant"]).first()
            if tenant is None:
                raise CommandError(f"No tenant {options['tenant']!r}.")
        why = (
            f"ended over {options['older_than']} ago"
            if older_than
            else "ended before its tenant's archive_after_days"
        )
        due = archive.due_runs(older_than=older_than, tenant=tenant)
        verb = "would move" if options["dry_run"] else "moved"
        total = 0
        for run in due:
            if options["dry_run"]:
                moved = archive.rows_of(run)
            else:
                try:
                    done = archive.run_archive(run, actor="system:archive_runs", reason=why)
                except archive.ArchiveTableMismatch as exc:
                    raise CommandError(str(exc)) from exc
                if done is None:
                    continue
                moved = done.moved
            total += sum(moved.values())
            counts = ", ".join(f"{table} {n}" for table, n in moved.items() if n) or "no rows"
            self.stdout.write(f"{verb} {run.pk} ({run.tenant.slug}, {run.state}): {counts}")
        summary = "would archive" if options["dry_run"] else "archived"
        self.stdout.write(f"{summary} {len(due)} runs ({total} rows); the event log is untouched.")
