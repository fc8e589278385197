"""Chat channels of a tenant, for its admins: the list, one POST view to add a
Slack-compatible incoming webhook and one to stop sending to it (toolcalls/channels.py)."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from runs.errors import DomainError
from runs.permissions import tenant_admin_required
from toolcalls import channels
from toolcalls.webhook_models import Webhook


def _page(
    request: HttpRequest, *, refusal: DomainError | None = None, status: int = 200
) -> HttpResponse:
    context = {
        "channels": [
            (channel, channels.describe(channel.event_types))
            for channel in channels.channel_list(tenant=request.user.tenant)
        ],
        "chat_events": [(event, channels.describe([event])) for event in Webhook.CHAT_EVENT_TYPES],
        "checked": request.POST.getlist("events") if refusal else list(Webhook.CHAT_EVENT_TYPES),
        "url": request.POST.get("url", "") if refusal else "",
        "refusal": refusal,
    }
    return render(request, "console/channels.html", context, status=status)


@require_GET
@tenant_admin_required
def channel_list(request: HttpRequest) -> HttpResponse:
    return _page(request)


@require_POST
@tenant_admin_required
def channel_add(request: HttpRequest) -> HttpResponse:
    try:
        channel = channels.channel_add(
            tenant=request.user.tenant,
            url=request.POST.get("url", "").strip(),
            event_types=request.POST.getlist("events"),
            by=request.user,
        )
    except DomainError as exc:
        # The form again with what was typed and the problem beside it; nothing was saved.
        return _page(request, refusal=exc, status=exc.status)
    messages.success(request, f"Channel added: {channels.describe(channel.event_types)} go to it.")
    return redirect("ops:channels")


@require_POST
@tenant_admin_required
def channel_deactivate(request: HttpRequest, channel_id: str) -> HttpResponse:
    try:
        channel = channels.channel_deactivate(
            tenant=request.user.tenant, channel_id=channel_id, by=request.user
        )
    except DomainError as exc:
        raise Http404(exc.message) from exc
    messages.success(request, f"Nothing more is sent to {channel.url}.")
    return redirect("ops:channels")
