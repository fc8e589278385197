from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin
from django.http import HttpRequest

from runs.models import ApiKey, Decision, Event, Run, Tenant, User


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "archive_after_days", "created_at")


@admin.register(User)
class CountersignUserAdmin(UserAdmin):
    list_display = ("username", "tenant", "role", "is_active", "is_staff")
    list_filter = ("tenant", "role", "is_active")
    fieldsets = (*UserAdmin.fieldsets, ("Tenant", {"fields": ("tenant", "role")}))
    add_fieldsets = (*UserAdmin.add_fieldsets, ("Tenant", {"fields": ("tenant", "role")}))


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    # Keys are issued with `manage.py create_api_key`, which shows the secret once and sets
    # the scopes; the admin lists them, sets an expiry and revokes them.
    list_display = (
        "id",
        "name",
        "tenant",
        "principal",
        "scope_list",
        "created_at",
        "expires_at",
        "revoked_at",
    )
    list_filter = ("tenant",)
    readonly_fields = ("id", "tenant", "scope_list", "secret_hash", "created_at")
    fields = (
        "id",
        "tenant",
        "name",
        "principal",
        "scope_list",
        "secret_hash",
        "created_at",
        "expires_at",
        "revoked_at",
    )

    @admin.display(description="scopes")
    def scope_list(self, key: ApiKey) -> str:
        return ", ".join(key.scopes) or "none (proposes nothing)"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


class ReadOnlyAdmin(admin.ModelAdmin):
    """Runtime facts change only through services that log events; the admin just reads."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("id", "tenant", "title", "state", "created_at")
    list_filter = ("tenant", "state")
    search_fields = ("id", "title", "correlation_id")


@admin.register(Decision)
class DecisionAdmin(ReadOnlyAdmin):
    list_display = ("id", "run", "kind", "version", "created_at")
    search_fields = ("id", "run__id")


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("id", "run", "seq", "event_type", "actor", "recorded_at")
    list_filter = ("event_type",)
    search_fields = ("id", "run__id", "tool_call_id", "approval_id", "correlation_id")
