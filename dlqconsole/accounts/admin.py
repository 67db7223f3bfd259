"""The audit log in the admin, and AuditedModelAdmin: every ModelAdmin of the console derives from it, so every
add, change and delete made in the admin (bulk deletes too) writes an audit row as the console's pages do.

Django's admin records its own LogEntry for these; the audit row is written where the LogEntry is (log_addition,
log_change, log_deletions), which a bulk delete reaches too (a post_save on LogEntry would miss it: a bulk
delete of several rows writes its LogEntries with bulk_create, which sends no signal). Admins whose saves go
through services that already write their own audit rows set `writes_own_audit = True`, so nothing is recorded
twice. auth's User and Group are registered again here with the mixin: role changes are the changes that matter
most. tests/accounts/test_admin_audit.py checks that every registered admin is audited.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.auth.admin import GroupAdmin as DjangoGroupAdmin
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.contrib.auth.models import Group, User
from django.db.models import Model, QuerySet
from django.http import HttpRequest

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.accounts.roles import ADMIN, VIEWER, has_role
from dlqconsole.accounts.services import record_audit

# Changed fields whose values stay out of the audit row (the change message still names them): passwords, and
# channel targets, whose webhook URLs carry tokens.
UNSHOWN_FIELDS = frozenset({"password", "password1", "password2", "target"})


def _shown(value: Any) -> str:
    if isinstance(value, QuerySet | list | tuple | set):
        return "[" + ", ".join(sorted(str(item) for item in value)) + "]"
    return str(value)


class AuditedModelAdmin[ModelT: Model](admin.ModelAdmin[ModelT]):
    """Writes an audit row (`admin.<app>.<model>.add|change|delete`) for every admin write to its model.

    It also checks the console's roles beside Django's model permissions: staff access with model permissions
    (granted by hand, or all at once) must not let a viewer or an operator change what their role cannot change on
    the console's pages. Writes need `write_role` (admin unless a subclass says otherwise), reading `view_role`."""

    # True where save_model / delete_model call services that write their own audit rows.
    writes_own_audit = False
    write_role = ADMIN
    view_role = VIEWER

    def has_view_permission(self, request: HttpRequest, obj: ModelT | None = None) -> bool:
        return super().has_view_permission(request, obj) and has_role(request.user, self.view_role)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return super().has_add_permission(request) and has_role(request.user, self.write_role)

    def has_change_permission(self, request: HttpRequest, obj: ModelT | None = None) -> bool:
        return super().has_change_permission(request, obj) and has_role(request.user, self.write_role)

    def has_delete_permission(self, request: HttpRequest, obj: ModelT | None = None) -> bool:
        return super().has_delete_permission(request, obj) and has_role(request.user, self.write_role)

    def construct_change_message(self, request: HttpRequest, form: Any, formsets: Any, add: bool = False) -> Any:
        # The change message names the changed fields; the audit row also says what they became.
        values = {
            name: _shown(form.cleaned_data[name])
            for name in form.changed_data
            if name not in UNSHOWN_FIELDS and name in form.cleaned_data
        }
        request.admin_audit_values = values  # type: ignore[attr-defined]
        return super().construct_change_message(request, form, formsets, add)

    def log_addition(self, request: HttpRequest, obj: ModelT, message: Any) -> LogEntry:
        entry = super().log_addition(request, obj, message)
        self._audit(request, [obj], verb="add", entry=entry)
        return entry

    def log_change(self, request: HttpRequest, obj: ModelT, message: Any) -> LogEntry:
        entry = super().log_change(request, obj, message)
        # Saving a form without changing anything ("No fields changed.") changes nothing: no audit row.
        if entry.change_message not in ("", "[]"):
            self._audit(request, [obj], verb="change", entry=entry)
        return entry

    def log_deletions(self, request: HttpRequest, queryset: QuerySet[ModelT]) -> Any:
        # Called before the rows go, one or many (the delete page and the bulk "delete selected" action).
        objects = list(queryset)
        entries = super().log_deletions(request, queryset)
        self._audit(request, objects, verb="delete", entry=None)
        return entries

    def _audit(self, request: HttpRequest, objects: Iterable[Model], *, verb: str, entry: LogEntry | None) -> None:
        if self.writes_own_audit:
            return
        meta = self.model._meta
        said = entry.get_change_message() if entry is not None else ""
        values = getattr(request, "admin_audit_values", {}) if verb != "delete" else {}
        detail = f": {said}" if said else ""
        if values:
            detail += " (" + "; ".join(f"{name}={value}" for name, value in values.items()) + ")"
        for obj in objects:
            record_audit(
                actor=request.user,
                action=f"admin.{meta.app_label}.{meta.model_name}.{verb}",
                target=f"{meta.model_name}:{obj.pk}",
                detail=f"{str(obj)[:200]}{detail}",
            )


@admin.register(AuditEntry)
class AuditEntryAdmin(AuditedModelAdmin[AuditEntry]):
    list_display = ["created_at", "actor_name", "action", "target", "count"]
    list_filter = ["action", "created_at"]
    search_fields = ["actor_name", "action", "target", "detail"]
    date_hierarchy = "created_at"

    def get_queryset(self, request: HttpRequest) -> QuerySet[AuditEntry]:
        # As on /audit/: sign-in rows (the name tried is often a password typed in the wrong field) are for admins.
        entries = super().get_queryset(request)
        return entries if has_role(request.user, ADMIN) else entries.exclude(action__startswith="accounts.login")

    # The audit log is append-only: nobody edits or deletes history, not even an admin.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: AuditEntry | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AuditEntry | None = None) -> bool:
        return False


admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class UserAdmin(AuditedModelAdmin[User], DjangoUserAdmin):  # type: ignore[misc]
    # Who holds which role, with their e-mail addresses: admins only.
    view_role = ADMIN


@admin.register(Group)
class GroupAdmin(AuditedModelAdmin[Group], DjangoGroupAdmin):
    view_role = ADMIN
