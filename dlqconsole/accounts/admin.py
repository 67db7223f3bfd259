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

from django import forms
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.auth.admin import GroupAdmin as DjangoGroupAdmin
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.contrib.auth.forms import AdminUserCreationForm, UserChangeForm
from django.contrib.auth.models import Group, User
from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest

from dlqconsole.accounts.models import AuditEntry
from dlqconsole.accounts.roles import ADMIN, OPERATOR, ROLES, VIEWER, has_role, role_group
from dlqconsole.accounts.services import record_audit, set_role

# Changed fields whose values stay out of the audit row (the change message still names them): passwords,
# channel targets, whose webhook URLs carry tokens, and brokers' URLs, which carry their passwords.
UNSHOWN_FIELDS = frozenset({"password", "password1", "password2", "target", "amqp_url", "management_url"})


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


ROLE_HELP = "Viewers read everything; operators also recover dead letters; admins also change configuration and users."


def _role_field() -> forms.ChoiceField:
    return forms.ChoiceField(label="Role", choices=[(role, role) for role in ROLES], help_text=ROLE_HELP)


class RoleFormMixin(forms.ModelForm):
    """The console role as one choice, in place of Django's groups, permissions, staff and superuser fields (the
    console reads the role groups only). It starts empty for a user without a role group, so that saving the form
    records their role, viewer, as a change (audited) rather than leaving it implied."""

    role = _role_field()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        user = self.instance
        if user.pk is None:
            return
        if user.is_superuser:
            # A superuser holds every role whatever their groups say (roles.py): a choice here would change nothing.
            self.fields["role"].initial = ADMIN
            self.fields["role"].disabled = True
            self.fields["role"].help_text = "A superuser (createsuperuser, ensure_admin) holds every role."
        else:
            self.fields["role"].initial = role_group(group.name for group in user.groups.all())


class UserRoleChangeForm(RoleFormMixin, UserChangeForm):
    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or self.cleaned_data
        user = self.instance
        active = cleaned.get("is_active", user.is_active)
        stays_admin = active and (user.is_superuser or cleaned.get("role") == ADMIN)
        if not stays_admin and user.pk is not None and _is_active_admin(user) and not _other_admins(user).exists():
            raise forms.ValidationError(
                f"{user.get_username()} is the last active admin: make another user an admin first, or nobody could "
                "manage users and configuration any more."
            )
        return cleaned


class UserRoleCreationForm(RoleFormMixin, AdminUserCreationForm):
    pass


def _admins() -> QuerySet[User]:
    """Active users who hold the admin role (superusers hold every role)."""
    return User.objects.filter(Q(is_superuser=True) | Q(groups__name=ADMIN), is_active=True).distinct()


def _is_active_admin(user: User) -> bool:
    return _admins().filter(pk=user.pk).exists()


def _other_admins(*users: User) -> QuerySet[User]:
    return _admins().exclude(pk__in=[user.pk for user in users])


class RoleListFilter(admin.SimpleListFilter):
    title = "role"
    parameter_name = "role"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(VIEWER, "viewer (or no role)"), (OPERATOR, "operator"), (ADMIN, "admin")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        admins = Q(is_superuser=True) | Q(groups__name=ADMIN)
        if self.value() == ADMIN:
            return queryset.filter(admins).distinct()
        if self.value() == OPERATOR:
            return queryset.filter(groups__name=OPERATOR).exclude(admins).distinct()
        if self.value() == VIEWER:
            return queryset.exclude(admins).exclude(groups__name=OPERATOR)
        return queryset


@admin.register(User)
class UserAdmin(AuditedModelAdmin[User], DjangoUserAdmin):  # type: ignore[misc]
    """Users by role. Django's staff flag, superuser flag, groups and per-user permissions are not shown: the
    console decides what a user may do from their role alone (admin_site.py)."""

    # Who holds which role, with their e-mail addresses: admins only (so only admins change roles).
    view_role = ADMIN
    form = UserRoleChangeForm
    add_form = UserRoleCreationForm
    fieldsets = (
        (None, {"fields": ("username", "password")}),
        ("Personal info", {"fields": ("first_name", "last_name", "email")}),
        ("Access", {"fields": ("role", "is_active")}),
        ("Important dates", {"fields": ("last_login", "date_joined")}),
    )
    add_fieldsets = (
        (None, {"classes": ("wide",), "fields": ("username", "usable_password", "password1", "password2", "role")}),
    )
    list_display = ("username", "role", "email", "first_name", "last_name", "is_active")
    list_filter = ("is_active", RoleListFilter)
    filter_horizontal = ()

    def get_queryset(self, request: HttpRequest) -> QuerySet[User]:
        return super().get_queryset(request).prefetch_related("groups")

    @admin.display(description="role")
    def role(self, user: User) -> str:
        if user.is_superuser:
            return "admin (superuser)"
        return role_group(group.name for group in user.groups.all()) or "viewer (no role)"

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        if "role" in form.changed_data:
            set_role(user=form.instance, role=form.cleaned_data["role"])

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple[Any, Any, Any, list[Any]]:
        """Deleting the last active admins is refused like deleting a protected object: the confirmation page says
        why and offers no button."""
        deleted, model_count, perms_needed, protected = super().get_deleted_objects(objs, request)
        users = list(objs)
        admins = [user for user in users if _is_active_admin(user)]
        if admins and not _other_admins(*users).exists():
            protected = [*protected, *(f"{user.get_username()}: the last active admin" for user in admins)]
        return deleted, model_count, perms_needed, protected


@admin.register(Group)
class GroupAdmin(AuditedModelAdmin[Group], DjangoGroupAdmin):
    view_role = ADMIN
