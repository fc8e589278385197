"""The console's pages, grouped by URL namespace (config/urls.py includes each group)."""

from __future__ import annotations

from django.urls import path

from console.views import (
    access,
    approval_edit,
    approvals,
    channels,
    desk,
    memory,
    ops,
    people,
    policies,
    runs,
)

runs_patterns = [
    path("", runs.run_list, name="list"),
    path("<str:run_id>/", runs.run_detail, name="detail"),
    path("<str:run_id>/feedback/", memory.run_feedback, name="feedback"),
]

approvals_patterns = [
    path("", approvals.inbox, name="inbox"),
    path("<str:approval_id>/", approvals.detail, name="detail"),
    path("<str:approval_id>/approve/", approvals.approve, name="approve"),
    path("<str:approval_id>/reject/", approvals.reject, name="reject"),
    path("<str:approval_id>/edit/", approvals.approve_with_edits, name="approve-with-edits"),
    path("<str:approval_id>/edit/preview/", approval_edit.preview_edits, name="preview-edits"),
    path("<str:approval_id>/edit/confirm/", approval_edit.confirm_edits, name="confirm-edits"),
    path("<str:approval_id>/context/", approval_edit.object_context, name="context"),
    path("<str:approval_id>/feedback/", memory.approval_feedback, name="feedback"),
]

desk_patterns = [
    path("", desk.desk_list, name="list"),
    path("runs/<str:run_id>/resume/", desk.resume_run, name="resume-run"),
    path("systems/<str:system>/look-up/", desk.look_up_system, name="look-up-system"),
    path("<str:tool_call_id>/", desk.desk_item, name="item"),
    path("<str:tool_call_id>/look-up/", desk.look_up, name="look-up"),
    path("<str:tool_call_id>/confirm/", desk.mark_confirmed, name="confirm"),
    path("<str:tool_call_id>/not-happened/", desk.mark_not_happened, name="not-happened"),
    path("<str:tool_call_id>/retry/", desk.retry, name="retry"),
    path("<str:tool_call_id>/compensate/", desk.compensate, name="compensate"),
    path("<str:tool_call_id>/abandon/", desk.abandon, name="abandon"),
    path("<str:tool_call_id>/claim/", desk.claim, name="claim"),
]

people_patterns = [
    path("", people.people_list, name="list"),
    path("<str:username>/unlock/", people.unlock, name="unlock"),
    path("<str:username>/role/", access.change_role, name="role"),
    path("keys/issue/", access.issue_key, name="issue_key"),
    path("keys/<str:key_id>/revoke/", access.revoke_key, name="revoke_key"),
]

policies_patterns = [
    path("", policies.policy_list, name="list"),
    path("<str:capability_id>/", policies.policy_detail, name="detail"),
    path("<str:capability_id>/edit/", policies.policy_edit, name="edit"),
    path("<str:capability_id>/try/", policies.policy_try, name="try"),
]

# Admin pages and /metrics, at the site root.
ops_patterns = [
    path("audit/", ops.audit_search, name="audit"),
    path("audit/export/", ops.audit_export, name="audit_export"),
    path("eval-traces/export/", memory.eval_trace_export, name="eval_trace_export"),
    path("dashboard/", ops.dashboard, name="dashboard"),
    path("webhooks/", ops.webhook_deliveries, name="webhooks"),
    path("channels/", channels.channel_list, name="channels"),
    path("channels/add/", channels.channel_add, name="channel_add"),
    path("channels/<str:channel_id>/stop/", channels.channel_deactivate, name="channel_deactivate"),
    path("metrics", ops.metrics_text, name="metrics"),
]
