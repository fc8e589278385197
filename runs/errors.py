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
    return DomainError(RESOURCE_NOT_FOUND, f"No {what} {ident!r}.", status=404)


# --- the error names of the base layer (approvals/errors.py and toolcalls/errors.py hold theirs)

RESOURCE_NOT_FOUND = "resource.not_found"  # missing, or another tenant's: the same answer
TENANT_EXISTS = "tenant.exists"
USER_EXISTS = "user.exists"
USER_INVALID_ROLE = "user.invalid_role"
USER_OWN_ROLE = "user.own_role"  # an admin taking their own admin role away
IDEMPOTENCY_CONFLICT = "idempotency.conflict"  # a key used before with another body
RUN_CLOSED = "run.closed"  # the run takes no new calls or decisions
RUN_INVALID_STATE = "run.invalid_state"  # a transition its state does not allow
RUN_WORK_IN_FLIGHT = "run.work_in_flight"  # finishing while calls are still on their way
RUN_ARCHIVED = "run.archived"  # its runtime rows were moved to the archive tables
DECISION_NOT_FOUND = "decision.not_found"
DECISION_KIND_MISMATCH = "decision.kind_mismatch"
DECISION_ALREADY_SUPERSEDED = "decision.already_superseded"
API_KEY_INVALID_SCOPE = "api_key.invalid_scope"  # a scope that names no capability
API_KEY_INVALID_EXPIRY = "api_key.invalid_expiry"  # an expiry already past
# The API's own refusals (config/api.py).
AUTH_UNAUTHENTICATED = "auth.unauthenticated"  # no key, a wrong, revoked or expired one
AUTH_SCOPE_MISSING = "auth.scope_missing"  # the key's scopes do not cover the capability
REQUEST_TOO_LARGE = "request.too_large"
REQUEST_MALFORMED_JSON = "request.malformed_json"
REQUEST_REFUSED = "request.refused"
REQUEST_VALIDATION_FAILED = "request.validation_failed"
REQUEST_UNSUPPORTED_MEDIA_TYPE = "request.unsupported_media_type"  # not a JSON body
REQUEST_DUPLICATE_KEY = "request.duplicate_key"
REQUEST_INVALID_STRING = "request.invalid_string"  # NUL or a lone surrogate
REQUEST_NUMBER_OUT_OF_RANGE = "request.number_out_of_range"  # beyond what canonical JSON carries
REQUEST_TOO_DEEP = "request.too_deep"
DATABASE_BUSY = "database.busy"  # a lock or statement timeout: try again shortly
# Run-scoped credentials (runs/credentials.py).
AUTH_CREDENTIAL_EXPIRED = "auth.credential_expired"  # 401: past its expiry
AUTH_CREDENTIAL_REVOKED = "auth.credential_revoked"  # 401: its run ended (or its key did)
AUTH_CREDENTIAL_RUN_BOUND = "auth.credential_run_bound"  # 403: another run, or no run at all
CREDENTIAL_SCOPE_TOO_WIDE = "credential.scope_too_wide"  # 403: wider than the minting key's
CREDENTIAL_TTL_TOO_LONG = "credential.ttl_too_long"  # 422: over the cap, or past the key's expiry
CREDENTIAL_MINTED_BY_CREDENTIAL = "credential.minted_by_credential"  # 403: only a key mints
