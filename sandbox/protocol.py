"""Types shared by the HTTP layer and the system handlers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class ApiError(Exception):
    """An error answered as JSON ``{"error": name, "message": ...}`` with an HTTP status."""

    def __init__(
        self, status: int, error: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message
        self.headers = headers or {}

    def reply(self) -> Reply:
        return Reply(self.status, {"error": self.error, "message": self.message}, self.headers)


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Call:
    """One parsed request to a system endpoint, as the handlers see it."""

    system: str
    body: dict[str, Any]
    query: dict[str, str]
    path_params: dict[str, str]
    request_id: str | None
    idempotency_key: str | None
    lookup_lag_seconds: float = 0.0


def invalid(message: str) -> ApiError:
    return ApiError(400, "invalid_request", message)


def require_str(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value.strip():
        raise invalid(f"{key} is required and must be a non-empty string")
    return value


def optional_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise invalid(f"{key} must be a string")
    return value


def require_positive_int(body: dict[str, Any], key: str) -> int:
    value = body.get(key)
    # bool is an int subclass in Python; true/false must not pass as 1/0.
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise invalid(f"{key} is required and must be an integer > 0")
    return value
