from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db import transaction
from django.db.models import Max
from django.http import HttpRequest

from approvals.models import Approval, ApprovalDecision, Notification, Policy
from approvals.policies import validate_rules
from runs.admin import ReadOnlyAdmin
from runs.admin_events import admin_event_append


class PolicyForm(forms.ModelForm):
    class Meta:
        model = Policy
        fields = [
            "tenant",
            "capability_id",
            "rules",
            "expiry_seconds",
            "on_expiry",
            "escalation_group",
            "escalate_before_seconds",
        ]

        help_texts = {
            "escalation_group": "Comma-separated: email addresses, and names of auth groups "
            "(their active members of this tenant with an address are mailed).",
        }

    def clean_rules(self) -> Any:
        rules = self.cleaned_data["rules"]
        problems = validate_rules(rules)
        if problems:
            raise forms.ValidationError(problems)
        return rules


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    """Saving writes the next version; earlier versions stay as approvals saw them."""

    form = PolicyForm
    list_display = ("capability_id", "tenant", "version", "on_expiry", "created_by", "created_at")
    list_filter = ("tenant", "capability_id")
    readonly_fields = ("version", "created_by", "created_at")

    def save_model(self, request: HttpRequest, obj: Policy, form: Any, change: bool) -> None:
        with transaction.atomic():
            latest = Policy.objects.filter(
                tenant=obj.tenant, capability_id=obj.capability_id
            ).aggregate(Max("version"))["version__max"]
            obj.pk = None  # never overwrite a version: insert the next one
            obj._state.adding = True
            obj.version = (latest or 0) + 1
            obj.created_by = f"user:{request.user.username}"
            obj.save()
            # Recorded like the console's edits (approvals/policy_edits.py), in this transaction.
            admin_event_append(
                tenant=obj.tenant,
                event_type="policy.published",
                subject=f"policy:{obj.capability_id}",
                payload={
                    "capability": obj.capability_id,
                    "version": obj.version,
                    "from_version": latest or 0,
                    "rules": obj.rules,
                    "expiry_seconds": obj.expiry_seconds,
                    "on_expiry": obj.on_expiry,
                    "escalation_group": obj.escalation_group,
                    "escalate_before_seconds": obj.escalate_before_seconds,
                },
                by=request.user,
            )

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class DecisionInline(admin.TabularInline):
    model = ApprovalDecision
    extra = 0
    can_delete = False
    readonly_fields = ("user", "decision", "reason", "summary_hash", "edit_diff", "created_at")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class NotificationInline(admin.TabularInline):
    """The approval's emails: to whom, how many tries, and when each was recorded as sent."""

    model = Notification
    extra = 0
    can_delete = False
    fields = ("kind", "recipients", "attempts", "claimed_until", "sent_at", "created_at")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    list_display = ("id", "tenant", "state", "rule_name", "required_approvers", "expires_at")
    list_filter = ("tenant", "state")
    search_fields = ("id", "tool_call__id", "run__id")
    inlines = [DecisionInline, NotificationInline]
