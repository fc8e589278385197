from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from config.api import api
from console import urls as console
from console.views import people
from console.views.home import home

urlpatterns = [
    path("", home, name="home"),
    path("login/", people.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("runs/", include((console.runs_patterns, "runs"))),
    path("approvals/", include((console.approvals_patterns, "approvals"))),
    path("desk/", include((console.desk_patterns, "desk"))),
    path("people/", include((console.people_patterns, "people"))),
    path("policies/", include((console.policies_patterns, "policies"))),
    path("", include((console.ops_patterns, "ops"))),
    path("api/v1/", api.urls),
    path("admin/", admin.site.urls),
]
