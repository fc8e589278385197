from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_date, parse_datetime

from runs.errors import API_KEY_INVALID_EXPIRY, DomainError
from runs.models import Tenant, User
from runs.services import api_key_issue


def expiry(value: str | None) -> datetime | None:
    """An ISO 8601 date or time; one without a zone is UTC, a date alone its midnight."""
    if not value:
        return None
    try:
        moment = parse_datetime(value)
        if moment is None and (day := parse_date(value)) is not None:
            moment = datetime(day.year, day.month, day.day)
    except ValueError:
        moment = None
    if moment is None:
        raise CommandError(f"--expires-at {value!r}: give an ISO 8601 time, 2031-01-31T12:00Z.")
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class Command(BaseCommand):
    help = "Issue an API key for a tenant's agent and print it once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--name", default="agent")
        parser.add_argument(
            "--principal", help="username of the person the agent acts for (never its approver)"
        )
        parser.add_argument(
            "--scope",
            action="append",
            required=True,
            dest="scopes",
            help="what the key may propose, repeatable: a capability id (refund-order-v2), a "
            "permission (payments.refund), a group (payments.*), or '*' for everything",
        )
        parser.add_argument(
            "--expires-at", help="ISO 8601 time after which the key is refused (default: never)"
        )

    def handle(self, *args: object, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}; create it with create_tenant.")
        principal = None
        if options["principal"]:
            principal = User.objects.filter(username=options["principal"], tenant=tenant).first()
            if principal is None:
                raise CommandError(f"No user {options['principal']!r} in tenant {tenant.slug}.")
        try:
            key, token = api_key_issue(
                tenant=tenant,
                name=options["name"],
                principal=principal,
                scopes=options["scopes"],
                expires_at=expiry(options["expires_at"]),
            )
        except DomainError as exc:
            flag = "--expires-at" if exc.name == API_KEY_INVALID_EXPIRY else "--scope"
            raise CommandError(f"{flag}: {exc.message}") from exc
        self.stderr.write(
            f"Issued {key.pk} for tenant {tenant.slug}, scopes {', '.join(key.scopes)}"
            f"{f', expires {key.expires_at.isoformat()}' if key.expires_at else ''}. "
            "It is shown only once:"
        )
        self.stdout.write(token)
