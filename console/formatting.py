"""How the console writes arguments for people: labels from the capability's schema titles,
amounts in cents as money of their currency ("$1,200.00", not "amount_cents 25000"; the
money itself is written by runs/money.py, which the e-mails and chat messages share)."""

from __future__ import annotations

import html
import re
from typing import Any

from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import TIME_STRINGS

from runs.money import (  # noqa: F401 - the console's names for them
    cents_to_major_units,
    major_units_to_cents,
    money,
)
from runs.money import summary_text as money_summary_text
from toolcalls import capabilities
from toolcalls.capabilities import Capability


def money_fields(capability: Capability | None) -> dict[str, str]:
    """The integer arguments that are amounts in cents, each with the argument naming its
    currency: `amount_cents` beside `currency`, as the contracts write them."""
    if capability is None:
        return {}
    properties = capability.input_schema.get("properties", {})
    if "currency" not in properties:
        return {}
    return {
        name: "currency"
        for name, spec in properties.items()
        if spec.get("type") == "integer" and name.endswith("_cents")
    }


def label(capability: Capability | None, name: str) -> str:
    """The schema's title of an argument; its name when the contract gives none."""
    if capability is None:
        return name
    spec = capability.input_schema.get("properties", {}).get(name, {})
    return spec.get("title") or name.replace("_", " ")


def value_text(
    capability: Capability | None,
    name: str,
    value: Any,
    args: dict,
    amounts: dict[str, str] | None = None,
) -> str:
    """`amounts`: money_fields(capability), when the caller formats many values of it."""
    currency_field = (money_fields(capability) if amounts is None else amounts).get(name)
    if currency_field:
        return money(value, args.get(currency_field))
    return "—" if value is None or value == "" else str(value)


def argument_rows(capability: Capability | None, args: dict[str, Any]) -> list[dict[str, Any]]:
    """The arguments in the schema's order (then any the schema does not name), labelled."""
    properties = capability.input_schema.get("properties", {}) if capability else {}
    names = [name for name in properties if name in args] + [n for n in args if n not in properties]
    amounts = money_fields(capability)
    return [
        {
            "name": name,
            "label": label(capability, name),
            "text": value_text(capability, name, args[name], args, amounts),
        }
        for name in names
    ]


def diff_rows(
    capability: Capability | None, diff: dict[str, dict[str, Any]], before: dict, after: dict
) -> list[dict[str, str]]:
    """An edit as people read it: "Amount $250.00 → $1,200.00"."""
    return [
        {
            "name": name,
            "label": label(capability, name),
            "from": value_text(capability, name, change.get("from"), before),
            "to": value_text(capability, name, change.get("to"), after),
        }
        for name, change in diff.items()
    ]


def summary_text(capability: Capability | str | None, args: dict[str, Any], stored: str) -> str:
    """The summary a person reads: the stored one (it is hashed into events, so it stays as
    the contract wrote it), with each amount the contract writes as "1200.00 USD" shown as
    money, "$1,200.00" (runs/money.py, which the e-mails and chat messages use too)."""
    if isinstance(capability, str):
        capability = capabilities.get(capability)
    return money_summary_text(stored, args, money_fields(capability))


# --- HTML written in Python, for the long lists: run page, desk, desk item, inbox ----------


def escaped(value: Any) -> str:
    """`value` escaped for HTML, as the template's autoescape and django.utils.html.escape
    write it; without their lazy-string wrapper and SafeString, which were most of the cost
    of escaping ~900 values a page with format_html. Most values (ids, statuses, names) hold
    nothing to escape: one search finds so, where html.escape runs five replaces."""
    text = str(value)
    return html.escape(text) if _SPECIAL(text) else text


_SPECIAL = re.compile("[&<>\"']").search  # what html.escape replaces


def html_of(parts: list[str]) -> SafeString:
    """Parts of markup, every value in them passed through `escaped`, as one safe string."""
    return mark_safe("".join(parts))


class _Unit:
    """One of timesince's units ("%(num)d minute"/"minutes"), translated once a page for each
    number rather than once a row: its lazy translation was most of timesince's cost."""

    __slots__ = ("lazy", "texts")

    def __init__(self, lazy: Any) -> None:
        self.lazy = lazy
        self.texts: dict[int, str] = {}

    def __mod__(self, args: dict[str, int]) -> str:
        num = args["num"]
        text = self.texts.get(num)
        if text is None:
            text = self.texts[num] = self.lazy % args
        return text


def time_units() -> dict[str, _Unit]:
    """timesince's and timeuntil's `time_strings` for one page (in the language active for
    it): the desk's and the runs list's long lists."""
    return {name: _Unit(lazy) for name, lazy in TIME_STRINGS.items()}


def url_pattern(name: str) -> str:
    """The URL of `name` for one id argument, as a str.format pattern: reversed once per page,
    not once per row (a `{% url %}` a row was a large part of a long list's time)."""
    return reverse(name, args=["ID"]).replace("ID", "{}")
