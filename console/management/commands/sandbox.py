"""``python manage.py sandbox``: run the simulated external systems (see sandbox)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from sandbox import serve


class Command(BaseCommand):
    help = "Run the sandbox HTTP server (payments, warehouse, carrier, mailer) until stopped."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8700)
        parser.add_argument(
            "--data-dir", default=None, help="SQLite state directory (default BASE_DIR/var/sandbox)"
        )
        parser.add_argument("--reset", action="store_true", help="re-seed all data on start")
        parser.add_argument("--quiet", action="store_true", help="no per-request log lines")

    def handle(self, *args: Any, **options: Any) -> None:
        data_dir = options["data_dir"] or Path(settings.BASE_DIR) / "var" / "sandbox"
        serve(
            host=options["host"],
            port=options["port"],
            data_dir=data_dir,
            reset=options["reset"],
            quiet=options["quiet"],
        )
