"""Pages for a tenant's admins: the audit trail and its export, the operations dashboard, the
webhook delivery log, and /metrics for Prometheus (one tenant for its admin, every tenant for
the internal token)."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from console import audit, audit_page, metrics
from console import dashboard as panels
from runs.permissions import tenant_admin_required
from toolcalls import selectors

AUDIT_PAGE_SIZE = 100


@require_GET
@tenant_admin_required
def audit_search(request: HttpRequest) -> HttpResponse:
    query, errors = audit.audit_query_from(request.GET)
    # A search it cannot read shows nothing rather than results it did not ask for.
    page = (
        audit_page.AuditPage([], "")
        if errors
        else audit_page.audit_page(tenant=request.user.tenant, query=query, size=AUDIT_PAGE_SIZE)
    )
    context = {
        "events": page.rows,
        "older": page.older,
        "errors": errors,
        "paged": bool(query.before),
    }
    return render(request, "runs/audit.html", context)


@require_GET
@tenant_admin_required
def audit_export(request: HttpRequest) -> HttpResponse:
    query, errors = audit.audit_query_from(request.GET)
    if errors:
        return HttpResponseBadRequest(" ".join(errors.values()), content_type="text/plain")
    tenant = request.user.tenant
    lines = audit.audit_jsonl(tenant=tenant, query=query)
    response = StreamingHttpResponse(lines, content_type="application/x-ndjson")
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = f'attachment; filename="audit-{tenant.slug}-{stamp}.jsonl"'
    return response


@never_cache
@require_GET
@tenant_admin_required
def dashboard(request: HttpRequest) -> HttpResponse:
    tenant, now = request.user.tenant, timezone.now()
    figures = metrics.collect(tenant=tenant, now=now)[tenant.slug]
    dwell = figures.unknown_dwell
    context = {
        "figures": figures,
        "now": now,
        "approval_ages": panels.approvals_by_age(tenant=tenant, now=now),
        "unknown_dwell": panels.dwell_buckets(dwell.cumulative, dwell.bounds, dwell.count),
        "trend": panels.trend(tenant=tenant, now=now),
    }
    template = "runs/dashboard.html#figures" if request.htmx else "runs/dashboard.html"
    return render(request, template, context)


@never_cache
@require_GET
@tenant_admin_required
def webhook_deliveries(request: HttpRequest) -> HttpResponse:
    deliveries = selectors.webhook_deliveries(tenant=request.user.tenant)
    return render(request, "toolcalls/webhooks.html", {"deliveries": deliveries})


def _token_matches(authorization: str) -> bool:
    scheme, _, token = authorization.partition(" ")
    expected = getattr(settings, "METRICS_TOKEN", "")
    # An empty setting turns token access off: no header can match it.
    if scheme.lower() != "bearer" or not expected:
        return False
    return hmac.compare_digest(token.strip().encode(), expected.encode())


@never_cache
@require_GET
def metrics_text(request: HttpRequest) -> HttpResponse:
    authorization = request.headers.get("Authorization", "")
    if authorization:
        if not _token_matches(authorization):
            response = HttpResponse("Wrong metrics token.\n", status=401, content_type="text/plain")
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
        figures = metrics.collect(tenant=None)
    elif request.user.is_authenticated and request.user.tenant_id and request.user.is_tenant_admin:
        figures = metrics.collect(tenant=request.user.tenant)
    else:
        # A scraper gets a status, not the login page.
        raise PermissionDenied("Sign in as a tenant admin, or send the metrics bearer token.")
    return HttpResponse(
        metrics.render_prometheus(figures), content_type=metrics.PROMETHEUS_CONTENT_TYPE
    )
