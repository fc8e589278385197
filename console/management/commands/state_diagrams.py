"""``python manage.py state_diagrams``: the state machines as Mermaid, from their transitions."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console import statediagrams


class Command(BaseCommand):
    help = (
        "Print docs/state-machines.md (one Mermaid diagram per state machine, from the "
        "models' transitions); --write writes it, --check fails when the file differs."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--write", action="store_true", help="write docs/state-machines.md")
        mode.add_argument(
            "--check", action="store_true", help="exit non-zero when the file is out of date"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        page = statediagrams.render_page()
        path = statediagrams.PAGE_PATH
        if options["write"]:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(page)
            self.stdout.write(f"Wrote {path}.")
        elif options["check"]:
            if not path.exists() or path.read_text() != page:
                raise CommandError(
                    f"{path} does not match the transitions in the models: "
                    f"run `{statediagrams.COMMAND}` and commit it."
                )
            self.stdout.write(f"{path} matches the transitions.")
        else:
            self.stdout.write(page, ending="")
