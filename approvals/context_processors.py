from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest

from approvals.selectors import pending_count


def pending_approvals(request: HttpRequest) -> dict[str, Callable[[], int]]:
    """The count in the navigation, for people of a tenant. A callable, which the template
    calls only when it shows the count: an htmx partial (the inbox's and the approval
    banner's polls, the run page's refresh) has no navigation, and the inbox's page passes the
    count it read already as `pending_approvals`, which hides this one."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or user.tenant_id is None:
        return {}
    tenant = user.tenant
    return {"pending_approvals": lambda: pending_count(tenant=tenant)}
