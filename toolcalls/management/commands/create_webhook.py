from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.models import Tenant
from toolcalls.models import Webhook


class Command(BaseCommand):
    help = "Add a webhook for a tenant and print its signing secret."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--url", required=True, help="where to POST the events")
        # The chat events (new approvals, escalations, desk items) are for chat channels,
        # added on the console's Channels page; a signed webhook takes them when named.
        default = [Webhook.EventType.APPROVAL_DECIDED, Webhook.EventType.TOOL_CALL_TERMINAL]
        parser.add_argument(
            "--events",
            default=",".join(default),
            help=f"comma-separated, of: {', '.join(Webhook.EventType.values)} "
            f"(default: {', '.join(default)})",
        )

    def handle(self, *args: object, **options: str) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}; create it with create_tenant.")
        events = [event.strip() for event in options["events"].split(",") if event.strip()]
        webhook = Webhook(tenant=tenant, url=options["url"], event_types=events)
        try:
            webhook.full_clean()
        except ValidationError as exc:
            raise CommandError(
                "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
            ) from exc
        webhook.save()
        self.stderr.write(f"Added {webhook.pk} for tenant {tenant.slug}. Its signing secret:")
        self.stdout.write(webhook.secret)
