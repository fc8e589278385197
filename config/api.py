"""The agent API: JSON under /api/v1/, one error shape, bearer-key auth per tenant."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.db import OperationalError
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.security import HttpBearer

from config.strict_json import StrictJSONParser, strict_request
from runs import errors, logcontext
from runs.credentials import credential_authenticate
from runs.errors import DomainError
from runs.models import ApiKey
from runs.selectors import api_key_authenticate
from runs.services import api_key_mark_used
from toolcalls.credential_routes import credential_check_route


class ApiKeyAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> ApiKey | None:
        if token.startswith("rcr_"):
            key = credential_authenticate(token)
            if key is not None:
                credential_check_route(key.run_credential, request)
        else:
            key = api_key_authenticate(token)
        if key is not None:
            logcontext.bind(tenant=key.tenant.slug)
            api_key_mark_used(key)
        return key


api = NinjaAPI(
    title="Countersign agent API",
    version="1",
    description=(
        "Agents propose side effects; Countersign validates, asks people when policy says so, "
        "dispatches once in effect and reports what really happened. Authenticate with "
        "`Authorization: Bearer <key>` (`manage.py create_api_key`). Errors are "
        '`{"error": {"name", "message", "details"}}` with a stable dotted name.'
    ),
    auth=ApiKeyAuth(),
    openapi_url="/openapi.json",
    docs_url="/docs",
    urls_namespace="api",
    # One strict parser for every body: media type, duplicate keys, NUL and lone surrogates,
    # numbers canonical JSON cannot carry (config/strict_json.py).
    parser=StrictJSONParser(),
)
# Paths and query strings meet the same rules; a body sent where none is expected too.
api.add_decorator(strict_request)


def error_response(
    request: HttpRequest,
    status: int,
    name: str,
    message: str,
    details: list[dict[str, Any]] | None = None,
) -> HttpResponse:
    body = {"error": {"name": name, "message": message, "details": details or []}}
    return api.create_response(request, body, status=status)


@api.exception_handler(DomainError)
def on_domain_error(request: HttpRequest, exc: DomainError) -> HttpResponse:
    return error_response(request, exc.status, exc.name, exc.message, exc.details)


@api.exception_handler(AuthenticationError)
def on_unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return error_response(
        request,
        401,
        errors.AUTH_UNAUTHENTICATED,
        "Send a valid, unrevoked API key as `Authorization: Bearer <key>`.",
    )


@api.exception_handler(RequestDataTooBig)
def on_too_large(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    return error_response(
        request,
        413,
        errors.REQUEST_TOO_LARGE,
        "The body is larger than this API accepts (API_MAX_BODY_BYTES); send less per request.",
    )


# lock_not_available and query_canceled: DATABASE_LOCK_TIMEOUT or DATABASE_STATEMENT_TIMEOUT
# ran out. The request's transaction was rolled back, so a retry is safe.
DATABASE_BUSY_SQLSTATES = {"55P03", "57014"}


@api.exception_handler(OperationalError)
def on_database_busy(request: HttpRequest, exc: OperationalError) -> HttpResponse:
    if getattr(exc.__cause__, "sqlstate", None) not in DATABASE_BUSY_SQLSTATES:
        raise exc
    response = error_response(
        request,
        503,
        errors.DATABASE_BUSY,
        "Another request holds what this one needs, or the database is slow; nothing was "
        "written. Send the same request again in a moment.",
    )
    response["Retry-After"] = "1"
    return response


@api.exception_handler(HttpError)
def on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # Ninja raises HttpError(400) for a body its parser refused; the strict parser says why.
    if isinstance(exc.__cause__, DomainError):
        return on_domain_error(request, exc.__cause__)
    if exc.status_code == 400:
        return error_response(
            request,
            400,
            errors.REQUEST_MALFORMED_JSON,
            "The body is not valid JSON; fix its syntax.",
        )
    return error_response(request, exc.status_code, errors.REQUEST_REFUSED, str(exc))


@api.exception_handler(ValidationError)
def on_validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    details = []
    for error in exc.errors:
        # Drop the parameter-source prefix ("body", "payload") so the path names the field.
        location = [str(part) for part in error.get("loc", ()) if part not in ("body", "payload")]
        details.append({"field": ".".join(location) or "(body)", "problem": error.get("msg", "")})
    fields = ", ".join(detail["field"] for detail in details)
    return error_response(
        request, 422, errors.REQUEST_VALIDATION_FAILED, f"Fix these fields: {fields}.", details
    )


def _register_routers() -> None:
    from memory.api import router as memory_router
    from runs.api import router as runs_router
    from toolcalls.api import router as toolcalls_router
    from toolcalls.api import run_router as run_lifecycle_router

    api.add_router("/", runs_router)
    api.add_router("/", run_lifecycle_router)
    api.add_router("/", toolcalls_router)
    api.add_router("/", memory_router)


_register_routers()
