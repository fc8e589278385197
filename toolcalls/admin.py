from __future__ import annotations

from django.contrib import admin

from toolcalls.models import Webhook


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    # The secret is shown so that an admin can set it at the receiver; deliveries are listed
    # on the console's webhook page.
    list_display = ("id", "tenant", "url", "event_types", "active", "created_at")
    list_filter = ("tenant", "active")
    readonly_fields = ("id", "created_at")
    fields = ("id", "tenant", "url", "event_types", "secret", "active", "created_at")
