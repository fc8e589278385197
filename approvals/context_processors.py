from __future__ import annotations

from django.http import HttpRequest

from approvals.selectors import pending_count


def pending_approvals(request: HttpRequest) -> dict[str, int]:
    """The count in the navigation, for people of a tenant."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or user.tenant_id is None:
        return {}
    return {"pending_approvals": pending_count(tenant=user.tenant)}
