"""How the console writes arguments for people: labels from the capability's schema titles,
amounts in cents as money of their currency ("$1,200.00", not "amount_cents 25000")."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from toolcalls import capabilities
from toolcalls.capabilities import Capability

SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥", "CAD": "CA$", "AUD": "A$"}
# Currencies without minor units: their "cents" are whole units.
NO_MINOR_UNITS = {"JPY", "KRW"}


def money(cents: Any, currency: str | None) -> str:
    """An amount in minor units of `currency`, with its symbol and two decimals."""
    if not isinstance(cents, int) or isinstance(cents, bool):
        return str(cents)
    code = (currency or "").upper()
    sign = "-" if cents < 0 else ""
    if code in NO_MINOR_UNITS:
        number = f"{abs(cents):,}"
    else:
        number = f"{abs(cents) // 100:,}.{abs(cents) % 100:02d}"
    symbol = SYMBOLS.get(code)
    return f"{sign}{symbol}{number}" if symbol else f"{sign}{number} {code}".strip()


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


def major_units_to_cents(text: str, currency: str | None) -> int:
    """ "1,200.50" typed in dollars → 120050 cents. Raises ValueError for anything that is not
    a plain amount with at most the currency's decimals."""
    cleaned = text.strip().replace(",", "")
    for symbol in SYMBOLS.values():
        cleaned = cleaned.removeprefix(symbol)
    if not cleaned or not all(c.isascii() and (c.isdigit() or c == ".") for c in cleaned):
        raise ValueError("an amount in digits, such as 1200 or 1200.50")
    try:
        amount = Decimal(cleaned)
    except InvalidOperation as exc:
        raise ValueError("an amount in digits, such as 1200 or 1200.50") from exc
    places = 0 if (currency or "").upper() in NO_MINOR_UNITS else 2
    cents = amount.scaleb(places)
    if cents != cents.to_integral_value():
        raise ValueError(f"at most {places} decimals")
    if cents > 2**53 - 1:
        raise ValueError("too large")
    return int(cents)


def cents_to_major_units(cents: Any, currency: str | None) -> str:
    """The value a money input shows: 25000 → "250.00"."""
    if not isinstance(cents, int) or isinstance(cents, bool):
        return ""
    if (currency or "").upper() in NO_MINOR_UNITS:
        return str(cents)
    return f"{cents // 100}.{cents % 100:02d}" if cents >= 0 else str(Decimal(cents) / 100)


def summary_text(capability: Capability | str | None, args: dict[str, Any], stored: str) -> str:
    """The summary a person reads: the stored one (it is hashed into events, so it stays as
    the contract wrote it), with each amount the contract writes as "1200.00 USD" shown as
    money, "$1,200.00". Anything it cannot match stays as stored."""
    if isinstance(capability, str):
        capability = capabilities.get(capability)
    if not isinstance(args, dict):
        return stored
    text = stored
    for name, currency_field in money_fields(capability).items():
        cents, currency = args.get(name), args.get(currency_field)
        if not isinstance(cents, int) or isinstance(cents, bool) or not isinstance(currency, str):
            continue
        written = f"{cents / 100:.2f} {currency.upper()}"
        text = text.replace(written, money(cents, currency))
    return text
