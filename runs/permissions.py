"""Who may see console pages: a signed-in person who belongs to a tenant; some pages only its
admins."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse


def tenant_member_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        # A superuser without a tenant manages the system in the admin; the console shows
        # tenant data only.
        if request.user.tenant_id is None:
            raise PermissionDenied("This account belongs to no tenant.")
        return view(request, *args, **kwargs)

    return wrapper


def tenant_admin_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @tenant_member_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        if not request.user.is_tenant_admin:
            raise PermissionDenied("Only the tenant's admins see this page.")
        return view(request, *args, **kwargs)

    return wrapper
