from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from dlqconsole.accounts.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin[AuditEntry]):
    list_display = ["created_at", "actor_name", "action", "target", "count"]
    list_filter = ["action", "created_at"]
    search_fields = ["actor_name", "action", "target", "detail"]
    date_hierarchy = "created_at"

    # The audit log is append-only: nobody edits or deletes history, not even an admin.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: AuditEntry | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AuditEntry | None = None) -> bool:
        return False
