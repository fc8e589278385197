from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.models import Tenant, User
from runs.services import api_key_issue


class Command(BaseCommand):
    help = "Issue an API key for a tenant's agent and print it once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--name", default="agent")
        parser.add_argument(
            "--principal", help="username of the person the agent acts for (never its approver)"
        )

    def handle(self, *args: object, **options: str) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}; create it with create_tenant.")
        principal = None
        if options["principal"]:
            principal = User.objects.filter(username=options["principal"], tenant=tenant).first()
            if principal is None:
                raise CommandError(f"No user {options['principal']!r} in tenant {tenant.slug}.")
        key, token = api_key_issue(tenant=tenant, name=options["name"], principal=principal)
        self.stderr.write(f"Issued {key.pk} for tenant {tenant.slug}. It is shown only once:")
        self.stdout.write(token)
