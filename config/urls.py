from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from config.api import api

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="runs:list", permanent=False)),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("runs/", include("runs.urls")),
    path("approvals/", include("approvals.urls")),
    path("desk/", include("toolcalls.urls")),
    path("", include("runs.ops_urls")),
    path("api/v1/", api.urls),
    path("admin/", admin.site.urls),
]
