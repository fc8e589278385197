"""One exception for every refusal a user or agent can act on.

The name is stable and dotted (`idempotency.conflict`), the message says what to fix, and the
status is what the API answers. Services raise it; the API and the console render it.
"""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    def __init__(
        self,
        name: str,
        message: str,
        *,
        status: int = 409,
        details: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message
        self.status = status
        self.details = details or []


def not_found(what: str, ident: str) -> DomainError:
    # Another tenant's object is reported exactly like a missing one.
    return DomainError("resource.not_found", f"No {what} {ident!r}.", status=404)
