"""How `bench_pages` clones a template run quickly: every string of the template (column values,
JSON payloads, each event's canonical body) is compiled once into a format string whose fields
are the ids and times it holds, so a clone fills all of them from one mapping of replacements
at C speed (`str.format_map`) instead of a regex pass per value.

Each event's hash is computed over the bytes `runs.events.compute_hash` hashes: the RFC 8785
form of the template event is made once with a stand-in previous hash, and cut there; a
clone's canonical bytes are that text with the clone's replacements (ids and times are plain
ASCII inside JSON strings, so replacing them commutes with canonicalisation), joined around
the clone's previous hash. `check_hashes` compares with `compute_hash` itself.
"""

from __future__ import annotations

import base64
import json
import random
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from hashlib import sha256
from types import SimpleNamespace
from typing import Any

import rfc8785

from runs.events import GENESIS_HASH, compute_hash, event_body
from runs.ids import _ALPHABET

# Ids we own and therefore re-issue in clones (API keys are shared by every clone).
ID_OR_TIME = re.compile(
    r"(?P<id>\b(?:run|dec|evt|tc|att|rcp|apr|obx|req|ckpt|fb)_[0-9A-HJKMNP-TV-Z]{26}\b)"
    r"|(?P<time>\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d)"
)
# A previous hash no real one equals: where a template event's canonical text is cut in two.
PREV_STANDIN = "p" * 64
# base64's base32 alphabet, position by position, to the ids' Crockford alphabet.
_CROCKFORD = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", _ALPHABET)

TEXT, TIME, AS_IS = 0, 1, 2  # how a cell of a cloned row is made


@dataclass
class Compiled:
    """A template's tokens (each distinct id and time it holds) and its compiled strings."""

    tokens: dict[str, str] = field(default_factory=dict)  # token -> its field name

    def text(self, value: str) -> str:
        out, last = [], 0
        for match in ID_OR_TIME.finditer(value):
            out.append(_escape(value[last : match.start()]))
            token = match.group(0)
            name = self.tokens.get(token)
            if name is None:
                name = self.tokens[token] = f"t{len(self.tokens)}"
            out.append("{" + name + "}")
            last = match.end()
        out.append(_escape(value[last:]))
        return "".join(out)

    def cell(self, value: Any) -> tuple[int, Any]:
        if isinstance(value, str):
            return TEXT, self.text(value)
        if isinstance(value, datetime):
            return TIME, value
        if isinstance(value, dict | list):
            return TEXT, self.text(json.dumps(value))
        return AS_IS, value

    def row(self, values: tuple | list) -> list[tuple[int, Any]]:
        return [self.cell(value) for value in values]


def _escape(literal: str) -> str:
    return literal.replace("{", "{{").replace("}", "}}")


@dataclass
class EventShape:
    """A template event ready to clone: its cells (in `columns` order, payload as JSON text)
    and its canonical body, compiled, cut around `prev_hash`."""

    cells: list[tuple[int, Any]]
    before: str
    after: str


def _keys(value: Any) -> Any:
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _keys(item)
    elif isinstance(value, list):
        for item in value:
            yield from _keys(item)


def event_shape(compiled: Compiled, row: dict[str, Any], columns: list[str]) -> EventShape:
    # A key that is an id or a time could sort differently once replaced: the replacement
    # would no longer be the canonical form. The templates have none; refuse if one appears.
    if any(ID_OR_TIME.search(key) for key in _keys(row["payload"])):
        raise RuntimeError(f"event {row['id']} has an id or a time as a JSON key")
    body = event_body(SimpleNamespace(**{**row, "prev_hash": PREV_STANDIN}))
    before, after = rfc8785.dumps(body).decode().split(f'"prev_hash":"{PREV_STANDIN}"')
    cells = compiled.row([row[c] for c in columns if c not in ("prev_hash", "hash")])
    return EventShape(cells, compiled.text(before), compiled.text(after))


class Clone:
    """One copy of a template: a new id for each of its ids, its times moved by `shift`."""

    def __init__(self, shift: timedelta, now: datetime) -> None:
        self.shift = shift
        self.moment = now + shift
        self.values: dict[str, str] = {}

    def prepare(self, compiled: Compiled) -> None:
        stamp = _time_part(self.moment)
        for token, name in compiled.tokens.items():
            if token[4] == "-" and token[:4].isdigit():  # a time
                moment = datetime.fromisoformat(token.replace(" ", "T")) + self.shift
                self.values[name] = moment.strftime(f"%Y-%m-%d{token[10]}%H:%M:%S")
            else:  # an id: the clone's time, new randomness, as `runs.ids.new_id` makes them
                tail = base64.b32encode(random.getrandbits(80).to_bytes(10, "big"))
                self.values[name] = f"{token.split('_', 1)[0]}_{stamp}{_crockford(tail)}"

    def row(self, cells: list[tuple[int, Any]]) -> list[Any]:
        values, shift = self.values, self.shift
        return [
            value.format_map(values) if kind == TEXT else value + shift if kind == TIME else value
            for kind, value in cells
        ]

    def events(self, shapes: list[EventShape]) -> list[list[Any]]:
        """Rows in `EVENT_COLUMNS` order (prev_hash and hash last), chained from genesis."""
        rows, prev_hash, values = [], GENESIS_HASH, self.values
        for shape in shapes:
            row = self.row(shape.cells)
            head, tail = shape.before.format_map(values), shape.after.format_map(values)
            hashed = sha256(f'{head}"prev_hash":"{prev_hash}"{tail}'.encode()).hexdigest()
            rows.append([*row, prev_hash, hashed])
            prev_hash = hashed
        return rows


def _time_part(moment: datetime) -> str:
    value, chars = int(moment.timestamp() * 1000), []
    for _ in range(10):
        value, digit = divmod(value, 32)
        chars.append(_ALPHABET[digit])
    return "".join(reversed(chars))


def _crockford(encoded: bytes) -> str:
    return encoded.decode().translate(_CROCKFORD)


def check_hashes(rows: list[list[Any]], columns: list[str]) -> None:
    """The cloned hashes must be `compute_hash`'s: checked on one clone of each template."""
    for row in rows:
        event = SimpleNamespace(**dict(zip(columns, row, strict=True)))
        event.payload = json.loads(event.payload)
        if compute_hash(event) != event.hash:
            raise RuntimeError(f"the clone's hash of {event.id} differs from compute_hash")
