"""Template helpers of the console: money, and times that a small script shows in the
viewer's own zone (static/js/times.js), with UTC written by the server as the fallback."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django import template
from django.urls import get_script_prefix, get_urlconf, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from console import formatting

register = template.Library()


@register.filter
def money(cents: Any, currency: str | None = None) -> str:
    return formatting.money(cents, currency)


@register.simple_tag
def summary_text(stored: str, capability: Any, args: dict[str, Any]) -> str:
    """The stored summary as a person reads it: amounts as money ("$1,200.00")."""
    return formatting.summary_text(capability, args, stored)


@register.simple_tag
def local_time(moment: datetime | None) -> SafeString | str:
    """`<time>` with the UTC time as text; times.js rewrites it in the viewer's zone, with
    the zone's name."""
    if moment is None:
        return "—"
    utc = moment.astimezone(UTC)
    return format_html(
        '<time datetime="{}" data-local>{}</time>',
        utc.isoformat(timespec="seconds"),
        utc.strftime("%Y-%m-%d %H:%M UTC"),
    )


def ago(moment: datetime, now: datetime) -> str:
    seconds = int((now - moment).total_seconds())
    if -60 < seconds < 60:
        return "just now"
    future = seconds < 0
    seconds = abs(seconds)
    for size, unit in ((86400, "day"), (3600, "hour"), (60, "minute")):
        if seconds >= size:
            count = seconds // size
            words = f"{count} {unit}{'s' if count != 1 else ''}"
            return f"in {words}" if future else f"{words} ago"
    return "just now"


@register.simple_tag
def relative_time(moment: datetime | None, now: datetime | None = None) -> SafeString | str:
    """ "just now", "3 minutes ago": kept current by times.js; the full time in its title."""
    if moment is None:
        return "—"
    utc = moment.astimezone(UTC)
    return format_html(
        '<time datetime="{}" data-relative title="{}">{}</time>',
        utc.isoformat(timespec="seconds"),
        utc.strftime("%Y-%m-%d %H:%M:%S UTC"),
        ago(moment, now or timezone.now()),
    )


@register.simple_tag
def nav_url(name: str) -> str:
    """`{% url name %}` for a URL without arguments, reversed once per URL configuration and
    script prefix rather than on every page: the navigation of base.html has eleven, about
    6 % of a console page's CPU when each was reversed per request (bench_pages --profile)."""
    key = (get_urlconf(), get_script_prefix(), name)
    url = _NAV_URLS.get(key)
    if url is None:
        url = _NAV_URLS[key] = reverse(name)
    return url


_NAV_URLS: dict[tuple[Any, str, str], str] = {}
