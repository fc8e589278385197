"""Failed logins and lock-outs of people (django-axes, configured in config/settings/base.py):
what the login page tells a person, what a tenant's admin sees, and unlocking someone."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from axes.helpers import get_cool_off
from axes.models import AccessAttempt
from axes.utils import reset as axes_reset
from django.conf import settings
from django.db.models import Sum
from django.http import HttpRequest
from django.utils import timezone

from runs.errors import not_found
from runs.models import Tenant, User

log = logging.getLogger(__name__)


def attempts_left(request: HttpRequest) -> int | None:
    """After a failed login: how many more failures lock this username from this address.
    None when this request recorded no failure."""
    failures = getattr(request, "axes_failures_since_start", None)
    if not failures:
        return None
    return max(settings.AXES_FAILURE_LIMIT - failures, 0)


def cooloff_minutes(request: HttpRequest | None = None) -> int:
    cooloff = get_cool_off(request) or timedelta(0)
    return round(cooloff.total_seconds() / 60)


@dataclass(frozen=True)
class LoginFailures:
    failures: int  # within the cool-off period, from every address
    locked_addresses: int  # addresses from which this username may not log in now


def login_failures(*, tenant: Tenant) -> dict[str, LoginFailures]:
    """Recent failed logins of the tenant's people, by username (only those with any)."""
    since = timezone.now() - (get_cool_off() or timedelta(0))
    usernames = User.objects.filter(tenant=tenant).values_list("username", flat=True)
    rows = (
        AccessAttempt.objects.filter(username__in=list(usernames), attempt_time__gte=since)
        .values("username", "ip_address")
        .annotate(failures=Sum("failures_since_start"))
    )
    found: dict[str, LoginFailures] = {}
    for row in rows:
        previous = found.get(row["username"], LoginFailures(0, 0))
        locked = row["failures"] >= settings.AXES_FAILURE_LIMIT
        found[row["username"]] = LoginFailures(
            previous.failures + row["failures"], previous.locked_addresses + int(locked)
        )
    return found


def user_unlock(*, tenant: Tenant, username: str, by: User) -> int:
    """Forget every recorded failed login of a person of `tenant`, from every address, so they
    can log in at once. Returns how many records were removed; logs who unlocked whom."""
    person = User.objects.filter(tenant=tenant, username=username).first()
    if person is None:
        raise not_found("person", username)  # another tenant's person too
    removed = axes_reset(username=person.username)
    log.warning(
        "login lock-out cleared: %s unlocked %s of tenant %s (%d failure records removed)",
        by.username,
        person.username,
        tenant.slug,
        removed,
    )
    return removed
