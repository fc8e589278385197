"""List the outbox messages the sweeper gave up on, and send one again once its cause is fixed.

python manage.py outbox_stuck
python manage.py outbox_stuck --requeue obx_...
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from runs import outbox


class Command(BaseCommand):
    help = "List outbox messages republished to the limit and never done; --requeue one."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--requeue", metavar="ID", help="publish this message again")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["requeue"]:
            taken = outbox.requeue(options["requeue"])
            if taken is None:
                raise CommandError(f"No stuck outbox message {options['requeue']}.")
            self.stdout.write(
                f"Requeued {options['requeue']}: "
                + (
                    "published again now."
                    if taken
                    else "the broker refused it; the sweeper will publish it."
                )
            )
            return
        messages = list(outbox.stuck())
        for message in messages:
            self.stdout.write(
                f"{message.pk}  {message.task}  args={message.args}  published "
                f"{message.published_count} times, last at {message.available_at:%Y-%m-%d %H:%M:%S}"
            )
        self.stdout.write(
            f"{len(messages)} stuck (republished {settings.OUTBOX_MAX_REPUBLISHES} times, "
            "never done). The worker's log says why their tasks fail."
        )
