from __future__ import annotations

import getpass

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.errors import DomainError
from runs.models import Tenant, User
from runs.services import user_create


class Command(BaseCommand):
    help = "Create a console user: manage.py create_user USERNAME --tenant SLUG --role ROLE"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--role", required=True, choices=User.Role.values)
        parser.add_argument("--email", default="")
        parser.add_argument("--password", help="asked for when omitted")

    def handle(self, *args: object, **options: str) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}; create it with create_tenant.")
        password = options["password"] or self._ask_password()
        try:
            user = user_create(
                username=options["username"],
                tenant=tenant,
                role=options["role"],
                password=password,
                email=options["email"],
            )
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"Created {user.role} {user.username} in tenant {tenant.slug}.")

    def _ask_password(self) -> str:
        password = getpass.getpass("Password: ")
        if not password or password != getpass.getpass("Password (again): "):
            raise CommandError("The passwords were empty or did not match.")
        return password
