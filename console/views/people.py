"""People and API keys of a tenant, for its admins: who is locked out of logging in (and one
POST view to unlock a person), and each key's scopes, expiry and state. Also the login page,
which says how many attempts are left after a failed one."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from runs import lockout
from runs.errors import DomainError
from runs.models import AdminEvent, ApiKey, User
from runs.permissions import tenant_admin_required
from runs.scopes import known_scopes


class LoginView(auth_views.LoginView):
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["attempts_left"] = lockout.attempts_left(self.request)
        context["cooloff_minutes"] = lockout.cooloff_minutes(self.request)
        return context


# Admin events listed on the page, newest first (the rest stay in the table).
RECENT_CHANGES = 20


# Where a newly issued key waits for the one GET that shows its token (console/views/access.py).
ISSUED_KEY = "issued_key"


@never_cache
@require_GET
@tenant_admin_required
def people_list(request: HttpRequest) -> HttpResponse:
    """The page; right after a key is issued, with its token, this once: popped from the
    session, so a refresh (or going back) never shows it again."""
    issued = request.session.pop(ISSUED_KEY, None)
    key = issued and ApiKey.objects.filter(tenant=request.user.tenant, pk=issued["id"]).first()
    if key is None:
        return people_page(request)
    return people_page(request, issued=(key, issued["token"]))


def people_page(request: HttpRequest, status: int = 200, **extra: Any) -> HttpResponse:
    """The page, also as the answer of its POST views (console/views/access.py) when they
    refuse something or show a new key's secret."""
    tenant = request.user.tenant
    failures = lockout.login_failures(tenant=tenant)
    people = [
        (person, failures.get(person.username))
        for person in User.objects.filter(tenant=tenant).order_by("username")
    ]
    keys = ApiKey.objects.filter(tenant=tenant).select_related("principal").order_by("name")
    context = {
        "people": people,
        "keys": keys,
        "changes": AdminEvent.objects.filter(tenant=tenant)[:RECENT_CHANGES],
        "roles": User.Role.choices,
        "known_scopes": known_scopes(),
        **extra,
    }
    return render(request, "runs/people.html", context, status=status)


@require_POST
@tenant_admin_required
def unlock(request: HttpRequest, username: str) -> HttpResponse:
    try:
        lockout.user_unlock(tenant=request.user.tenant, username=username, by=request.user)
    except DomainError as exc:
        raise Http404(exc.message) from exc
    messages.success(request, f"{username} can log in again, from every address.")
    return redirect("people:list")
