"""The agent API's one JSON parser: what it lets in can be stored, hashed and read back.

Every body sent to /api/v1/ goes through `parse_body` before any field is looked at: django-ninja
calls it for operations with a body, and `strict_request` runs it for those without one (a
command such as retry ignores its body, but a hostile one is refused all the same). In order:

- declared as JSON (`application/json` or `application/…+json`, UTF-8), else 415
  `request.unsupported_media_type`: a form or a text/plain body is not parsed as JSON;
- valid UTF-8 JSON, else 400 `request.malformed_json`;
- no key twice in one object, else 400 `request.duplicate_key` (json.loads keeps the last);
- no NUL and no lone surrogate in any string or key, else 422 `request.invalid_string`:
  PostgreSQL can store neither (text refuses NUL, and a lone surrogate has no UTF-8 form);
- every number finite and within what canonical JSON carries (`runs.canonical`), else 422
  `request.number_out_of_range`: a larger one would be stored, then break the event chain's
  hash when read back;
- nested at most MAX_DEPTH levels, else 422 `request.too_deep`.

The path, the query string and the headers are held to the same rules for strings
(`strict_request`).
"""

from __future__ import annotations

import functools
import json
from collections import deque
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest
from ninja.parser import Parser

from runs import errors
from runs.canonical import MAX_SAFE_INTEGER, number_problem
from runs.errors import DomainError

_CHECKED = "_countersign_body_checked"
# Reported per body; past this the client has enough to fix.
MAX_DETAILS = 20
# Deeper JSON overflows the stack of the recursive encoders it meets later (json.dumps,
# RFC 8785) at a few hundred levels; no argument or metadata of an agent needs this many.
MAX_DEPTH = 64


class StrictJSONParser(Parser):
    def parse_body(self, request: HttpRequest) -> Any:
        return parse_body(request)


def strict_request(view_func: Callable[..., Any]) -> Callable[..., Any]:
    """Applied to every operation (after auth, before the view): the path, the query string
    and the headers meet the rules for strings, and a body that no body parameter parsed is
    parsed."""

    @functools.wraps(view_func)
    def view(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        strings = []
        if problem := _string_problem(request.path):
            strings.append(_detail(("(path)",), problem))
        for name, values in request.GET.lists():
            for value in (name, *values):
                if problem := _string_problem(value):
                    strings.append(_detail(("query", _printable(name)), problem))
        for name, value in request.headers.items():
            if problem := _string_problem(value):
                strings.append(_detail(("header", name), problem))
        if strings:
            raise _refusal(errors.REQUEST_INVALID_STRING, "strings that cannot be stored", strings)
        if request.body and not getattr(request, _CHECKED, False):
            parse_body(request)
        return view_func(request, *args, **kwargs)

    return view


def parse_body(request: HttpRequest) -> Any:
    _check_media_type(request)
    try:
        text = request.body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _malformed(f"it is not UTF-8 (byte {exc.start})") from None
    try:
        data = json.loads(
            text,
            object_pairs_hook=_object_without_duplicates,
            parse_int=_parse_int,
            parse_constant=float,  # NaN and Infinity: reported below with the other numbers
        )
    except json.JSONDecodeError as exc:
        raise _malformed(f"{exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except RecursionError:
        raise _malformed("it is nested too deeply") from None
    _check_values(data)
    setattr(request, _CHECKED, True)
    return data


def _check_media_type(request: HttpRequest) -> None:
    media_type = request.content_type or ""
    charset = request.content_params.get("charset", "utf-8").lower()
    is_json = media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )
    if not is_json or charset not in ("utf-8", "utf8"):
        declared = (request.META.get("CONTENT_TYPE") or "no Content-Type")[:100]
        raise DomainError(
            errors.REQUEST_UNSUPPORTED_MEDIA_TYPE,
            f"This API reads JSON bodies only ({declared} was sent): send the body as UTF-8 "
            "JSON with `Content-Type: application/json`.",
            status=415,
        )


def _malformed(why: str) -> DomainError:
    return DomainError(
        errors.REQUEST_MALFORMED_JSON, f"The body is not valid JSON: {why}; fix it.", status=400
    )


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise DomainError(
                errors.REQUEST_DUPLICATE_KEY,
                f"The key {_printable(key)!r} appears twice in one object; send it once.",
                status=400,
                details=[{"field": _printable(key), "problem": "duplicate key"}],
            )
        result[key] = value
    return result


class _LongInteger:
    """An integer literal too long to be in range: not converted at all, since int() of a
    very long literal is slow (and refused past 4,300 digits)."""


def _parse_int(text: str) -> int | _LongInteger:
    return _LongInteger() if len(text) > len(str(MAX_SAFE_INTEGER)) + 1 else int(text)


def _string_problem(value: str) -> str | None:
    if "\x00" in value:
        return "contains a NUL character (\\u0000), which cannot be stored"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (\\ud800-\\udfff), which is not Unicode text"
    return None


def _printable(key: str) -> str:
    return key if _string_problem(key) is None else ascii(key)[1:-1]


def _check_values(data: Any) -> None:
    strings: list[dict[str, str]] = []
    numbers: list[dict[str, str]] = []
    # Iterative, so a deeply nested body cannot exhaust the stack here.
    queue: deque[tuple[tuple[str, ...], Any]] = deque([((), data)])
    while queue:
        path, value = queue.popleft()
        if len(path) > MAX_DEPTH:
            raise DomainError(
                errors.REQUEST_TOO_DEEP,
                f"The body nests deeper than {MAX_DEPTH} levels at {'.'.join(path[:8])}…; "
                "flatten it.",
                status=422,
                details=[_detail(path[:MAX_DEPTH], f"nested deeper than {MAX_DEPTH} levels")],
            )
        if isinstance(value, dict):
            for key, item in value.items():
                if problem := _string_problem(key):
                    strings.append(_detail((*path, _printable(key)), f"key {problem}"))
                queue.append(((*path, _printable(key)), item))
        elif isinstance(value, list):
            queue.extend(((*path, str(index)), item) for index, item in enumerate(value))
        elif isinstance(value, str):
            if problem := _string_problem(value):
                strings.append(_detail(path, problem))
        elif isinstance(value, _LongInteger):
            numbers.append(_detail(path, number_problem(MAX_SAFE_INTEGER + 1)))
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int | float) and (problem := number_problem(value)):
            numbers.append(_detail(path, problem))
    if strings:
        raise _refusal(errors.REQUEST_INVALID_STRING, "strings that cannot be stored", strings)
    if numbers:
        raise _refusal(errors.REQUEST_NUMBER_OUT_OF_RANGE, "numbers out of range", numbers)


def _detail(path: tuple[str, ...], problem: str) -> dict[str, str]:
    return {"field": ".".join(path) or "(body)", "problem": problem}


def _refusal(name: str, what: str, details: list[dict[str, str]]) -> DomainError:
    fields = ", ".join(detail["field"] for detail in details[:MAX_DETAILS])
    return DomainError(
        name, f"The body has {what}: fix {fields}.", status=422, details=details[:MAX_DETAILS]
    )
