"""Who may do what in a tenant, for its admins: a person's role, and API keys issued (the
secret shown once) and revoked — each through a runs service that records an admin event
(runs/admin_events.py). The page itself is people.people_list."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from console.views.people import ISSUED_KEY, people_page
from runs.errors import DomainError
from runs.models import ApiKey, User
from runs.permissions import tenant_admin_required
from runs.services import api_key_issue, api_key_revoke, user_change_role


@require_POST
@tenant_admin_required
def change_role(request: HttpRequest, username: str) -> HttpResponse:
    role = request.POST.get("role", "")
    try:
        person = user_change_role(
            tenant=request.user.tenant, username=username, role=role, by=request.user
        )
    except DomainError as exc:
        if exc.status == 404:
            raise Http404(exc.message) from exc
        return people_page(request, refusal=exc, status=exc.status)
    messages.success(request, f"{person.username} is now {person.get_role_display().lower()}.")
    return redirect("people:list")


def _expiry(days: str) -> datetime | None:
    if not days.strip():
        return None
    if not days.strip().isdigit() or not 1 <= int(days) <= 3650:
        raise ValueError("Expires in: a whole number of days from 1 to 3650, or empty for never.")
    return datetime.now(UTC) + timedelta(days=int(days))


@require_POST
@tenant_admin_required
def issue_key(request: HttpRequest) -> HttpResponse:
    """Issue a key, then redirect to the people page, which shows its token once.

    Post/Redirect/Get: answering the POST with the token made a refresh post again and issue
    a second key. The token waits in the server-side session (the cookie holds only the
    session's id) until that GET pops it; it is never stored anywhere else or shown again."""
    tenant = request.user.tenant
    name = request.POST.get("name", "").strip()
    scopes = [s.strip() for s in request.POST.get("scopes", "").split(",") if s.strip()]
    principal_name = request.POST.get("principal", "")
    principal = User.objects.filter(tenant=tenant, username=principal_name).first()
    try:
        if not name:
            raise ValueError("Name the key after the agent that will use it.")
        if principal_name and principal is None:
            raise ValueError(f"No person {principal_name!r} in this tenant.")
        key, token = api_key_issue(
            tenant=tenant,
            name=name,
            scopes=scopes,
            principal=principal,
            expires_at=_expiry(request.POST.get("expires_in_days", "")),
            by=request.user,
        )
    except (ValueError, DomainError) as exc:
        message = exc.message if isinstance(exc, DomainError) else str(exc)
        return people_page(request, key_problem=message, typed=request.POST, status=422)
    request.session[ISSUED_KEY] = {"id": key.pk, "token": token}
    return redirect("people:list")


@require_POST
@tenant_admin_required
def revoke_key(request: HttpRequest, key_id: str) -> HttpResponse:
    key = ApiKey.objects.filter(tenant=request.user.tenant, pk=key_id).first()
    if key is None:
        raise Http404("No such API key.")
    api_key_revoke(api_key=key, by=request.user)
    messages.success(request, f"Key {key.name} ({key.pk}) is revoked: agents using it get 401.")
    return redirect("people:list")
