from __future__ import annotations

from django.urls import path

from toolcalls import views

app_name = "desk"
urlpatterns = [
    path("", views.desk_list, name="list"),
    path("runs/<str:run_id>/resume/", views.desk_resume_run, name="resume-run"),
    path("<str:tool_call_id>/", views.desk_item, name="item"),
    path("<str:tool_call_id>/command/", views.desk_command, name="command"),
]
