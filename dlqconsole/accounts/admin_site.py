"""The Django admin, entered by role.

Every console role may sign in to the admin (`/admin/`), not only users with Django's staff flag: an on-call
operator recovers by hand there, an admin manages retry policies, fingerprint rules and users there. What each role
sees and changes is decided by the role, as on the console's pages: `AuditedModelAdmin` checks it for every model,
and `RolePermissionBackend` answers Django's model-permission questions from it, so nobody has to keep per-user
model permissions in step with the roles. Permissions granted by hand still add to a staff user's (ModelBackend),
but never past what the role allows (AuditedModelAdmin)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.http import HttpRequest
from django.template.response import TemplateResponse

from dlqconsole.accounts.roles import ADMIN, role_of
from dlqconsole.accounts.services import record_audit

# The console's own apps: any role has Django's permissions on their models, and AuditedModelAdmin narrows them to
# what the role may do (write_role, view_role).
CONSOLE_APPS = frozenset({"accounts", "deadletters", "ingest", "operations", "alerts"})
# Users and groups (the roles themselves): the admin role only.
ADMIN_ONLY_APPS = frozenset({"auth"})


def may_enter(user: Any) -> bool:
    return bool(user.is_active and (user.is_staff or role_of(user) is not None))


class ConsoleAdminAuthenticationForm(AdminAuthenticationForm):
    """The admin's login form lets in whom the site lets in: Django's own refuses everyone without the staff flag,
    so a console role whose session ran out on an admin page could not sign in again there."""

    # Django's admin asks for "a staff account"; any console role signs in here.
    error_messages = AuthenticationForm.error_messages

    def confirm_login_allowed(self, user: Any) -> None:
        AuthenticationForm.confirm_login_allowed(self, user)
        if not may_enter(user):
            raise ValidationError(
                self.error_messages["invalid_login"],
                code="invalid_login",
                params={"username": self.username_field.verbose_name},
            )


class ConsoleAdminSite(admin.AdminSite):
    site_header = "dlqconsole administration"
    site_title = "dlqconsole admin"
    login_form = ConsoleAdminAuthenticationForm

    def has_permission(self, request: HttpRequest) -> bool:
        return may_enter(request.user)

    def password_change(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> TemplateResponse:
        """Every role reaches this page now: a password changed here gets its audit row, like every operation."""
        response = super().password_change(request, extra_context)
        # The view redirects only after it saved the new password; a refused form is shown again (200).
        if request.method == "POST" and response.status_code == 302:
            record_audit(
                actor=request.user,
                action="accounts.password.change",
                target=f"user:{request.user.get_username()}",
                detail="changed in the admin",
            )
        return response


class RolePermissionBackend:
    """Django permissions from the console's roles (no sign-in: ModelBackend checks passwords)."""

    def authenticate(self, request: HttpRequest | None, **credentials: Any) -> None:
        return None

    def has_module_perms(self, user_obj: Any, app_label: str) -> bool:
        role = role_of(user_obj)
        if role is None:
            return False
        return app_label in CONSOLE_APPS or (app_label in ADMIN_ONLY_APPS and role == ADMIN)

    def has_perm(self, user_obj: Any, perm: str, obj: Any = None) -> bool:
        return self.has_module_perms(user_obj, perm.partition(".")[0])
