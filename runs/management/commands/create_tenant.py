from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.errors import DomainError
from runs.services import tenant_create


class Command(BaseCommand):
    help = "Create a tenant: manage.py create_tenant SLUG --name NAME"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", required=True)

    def handle(self, *args: object, slug: str, name: str, **options: object) -> None:
        try:
            tenant = tenant_create(slug=slug, name=name)
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"Created tenant {tenant.slug} ({tenant.name}).")
