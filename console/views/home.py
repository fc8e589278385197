"""Where a person lands: admins on the unknowns desk when something waits there, people who
decide on their inbox, everyone else on the runs."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from console import desk
from runs.permissions import tenant_member_required


@tenant_member_required
def home(request: HttpRequest) -> HttpResponse:
    user = request.user
    if user.is_tenant_admin and desk.desk_has_items(tenant=user.tenant):
        return redirect("desk:list")
    if user.can_decide:
        return redirect("approvals:inbox")
    return redirect("runs:list")
