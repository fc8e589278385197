"""Money as people read it, in one place every layer can import: the approval e-mails
(approvals), the chat messages and the contracts' summaries (toolcalls) and the console all
write "$1,200.00" the same way. Amounts are integers in the currency's minor units ("cents");
a currency without minor units (JPY) counts whole units."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥", "CAD": "CA$", "AUD": "A$"}
# Currencies without minor units: their "cents" are whole units.
NO_MINOR_UNITS = {"JPY", "KRW"}


def is_amount(cents: Any) -> bool:
    return isinstance(cents, int) and not isinstance(cents, bool)


def money(cents: Any, currency: str | None) -> str:
    """An amount in minor units of `currency`, with its symbol and the currency's decimals."""
    if not is_amount(cents):
        return str(cents)
    code = (currency or "").upper()
    sign = "-" if cents < 0 else ""
    if code in NO_MINOR_UNITS:
        number = f"{abs(cents):,}"
    else:
        number = f"{abs(cents) // 100:,}.{abs(cents) % 100:02d}"
    symbol = SYMBOLS.get(code)
    return f"{sign}{symbol}{number}" if symbol else f"{sign}{number} {code}".strip()


def amount_written(cents: int, currency: str) -> str:
    """How a contract writes an amount in its stored summary: plain, no grouping, the code
    after it ("1200.00 USD", "1500 JPY"). The summary is hashed into events, so this form
    stays stable; people read it through `summary_text`."""
    code = currency.upper()
    if code in NO_MINOR_UNITS:
        return f"{cents} {code}"
    return f"{cents / 100:.2f} {code}"


def money_fields_of(args: dict[str, Any]) -> dict[str, str]:
    """The arguments that are amounts, each with the argument naming its currency: an integer
    `*_cents` beside a `currency`, as the contracts write them."""
    if not isinstance(args.get("currency"), str):
        return {}
    return {name: "currency" for name, value in args.items() if name.endswith("_cents")}


def summary_text(stored: str, args: Any, fields: dict[str, str] | None = None) -> str:
    """The summary a person reads: the stored one, with each amount the contract wrote as
    "1200.00 USD" shown as money, "$1,200.00". `fields` names the money arguments (the
    capability's schema, when the caller knows it); else they are read off the arguments.
    Anything it cannot match stays as stored."""
    if not isinstance(args, dict):
        return stored
    text = stored
    for name, currency_field in (money_fields_of(args) if fields is None else fields).items():
        cents, currency = args.get(name), args.get(currency_field)
        if not is_amount(cents) or not isinstance(currency, str):
            continue
        shown = money(cents, currency)
        text = text.replace(amount_written(cents, currency), shown)
        # Summaries stored before zero-decimal currencies were written whole ("15.00 JPY"
        # for 1500 JPY) are still in the tables: they read as the same money.
        text = text.replace(f"{cents / 100:.2f} {currency.upper()}", shown)
    return text


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
    if not is_amount(cents):
        return ""
    if (currency or "").upper() in NO_MINOR_UNITS:
        return str(cents)
    return f"{cents // 100}.{cents % 100:02d}" if cents >= 0 else str(Decimal(cents) / 100)
