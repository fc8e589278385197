"""Admin pages and /metrics, included at the site root by config/urls.py."""

from __future__ import annotations

from django.urls import path

from runs import ops_views

app_name = "ops"
urlpatterns = [
    path("audit/", ops_views.audit_search, name="audit"),
    path("audit/export/", ops_views.audit_export, name="audit_export"),
    path("dashboard/", ops_views.dashboard, name="dashboard"),
    path("metrics", ops_views.metrics_text, name="metrics"),
]
